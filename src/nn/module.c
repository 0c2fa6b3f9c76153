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
    r->checkpointed = src->checkpointed;
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
    ts_status st = m->checkpointed && ts_grad_is_enabled() ? ts__checkpoint_forward(m, x, out)
                                                           : m->vt->forward(m, x, out);
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
        [TS_MODULE_BOTTLENECK] = "Bottleneck",
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

/* ---- load_state_dict -----------------------------------------------------------------------
 * Pass 1 walks the model and records every problem — each key of the model missing from sd,
 * each shape or dtype mismatch — then lists sd's keys the model does not have; only when there is
 * none (strict) or only missing/unexpected ones (not strict) does pass 2 copy. The error message
 * counts each kind of problem and names the first LOAD_LIST_MAX of each ("... and N more" past
 * that or past the kind's share of the buffer, less room for a caller's prefix such as the file's
 * name): a whole wrong model is a line, not a page of keys. When the state dict says which zoo
 * model it came from and m is another, the message says that first and names no keys. */
#define LOAD_LIST_MAX 5
#define LOAD_MSG_MAX (TS_ERRMSG_MAX - 192) /* room for callers' context ("FILE: ...") in the message */

typedef struct load_problems {
    char **missing; /* model keys (copies) */
    int nmissing, cap_missing;
    char **mismatch; /* "size mismatch for 'k': ..." / "dtype mismatch ..." lines (copies) */
    int nmismatch, cap_mismatch;
    int nshape, ndtype;
} load_problems;

typedef struct load_ctx {
    const ts_tensor_list *sd;
    bool strict, copy;
    unsigned char *seen; /* per sd entry */
    load_problems *pb;
} load_ctx;

static int find_index(const ts_tensor_list *l, const char *name) {
    for (int i = 0; i < l->n; i++)
        if (strcmp(l->names[i], name) == 0) return i;
    return -1;
}

static ts_status push_str(char ***v, int *n, int *cap, const char *s) {
    if (*n == *cap) {
        int nc = *cap ? *cap * 2 : 16;
        char **nv = ts__realloc(*v, sizeof *nv * (size_t)nc);
        if (!nv) return TS_ERR_NOMEM;
        *v = nv;
        *cap = nc;
    }
    char *c = ts__strdup(s);
    if (!c) return TS_ERR_NOMEM;
    (*v)[(*n)++] = c;
    return TS_OK;
}

static ts_status load_fn(void *vctx, const char *name, ts_tensor **slot, bool is_param) {
    load_ctx *c = vctx;
    int i = find_index(c->sd, name);
    if (i < 0) {
        if (c->strict) return push_str(&c->pb->missing, &c->pb->nmissing, &c->pb->cap_missing, name);
        return TS_OK;
    }
    c->seen[i] = 1;
    ts_tensor *src = c->sd->tensors[i], *dst = *slot;
    if (!c->copy) {
        char a[128], b[128], nb[160], line[600];
        ts__printable(name, nb, sizeof nb);
        if (!ts__same_shape(src, dst)) {
            snprintf(line, sizeof line, "size mismatch for '%s': the state dict has shape %s, the model has shape %s",
                     nb, ts_shape_str(src->ndim, src->shape, a, sizeof a),
                     ts_shape_str(dst->ndim, dst->shape, b, sizeof b));
            c->pb->nshape++;
        } else if (src->dtype != dst->dtype) {
            snprintf(line, sizeof line, "dtype mismatch for '%s': the state dict has %s, the model has %s", nb,
                     ts_dtype_name(src->dtype), ts_dtype_name(dst->dtype));
            c->pb->ndtype++;
        } else {
            return TS_OK;
        }
        return push_str(&c->pb->mismatch, &c->pb->nmismatch, &c->pb->cap_mismatch, line);
    }
    ts_status st = ts_tensor_copy_(dst, src);
    if (st != TS_OK) return ts__error_prefix(st, "load_state_dict: '%s'", name);
    return TS_OK;
}

/* Appends "<head>item, item, ... and N more" to buf (len, cap) using at most `budget` bytes. */
static void list_problems(char *buf, size_t *len, size_t cap, size_t budget, const char *head, char **items, int n,
                          bool quote, const char *sep) {
    size_t start = *len, end = TS_MIN(cap - 1, start + budget);
    char more[48];
    int shown = 0;
    size_t k = *len;
    int w = snprintf(buf + k, end > k ? end - k + 1 : 0, "%s", head);
    if (w < 0 || k + (size_t)w > end) {
        buf[*len] = '\0';
        return;
    }
    k += (size_t)w;
    for (; shown < n && shown < LOAD_LIST_MAX; shown++) {
        char nb[600];
        const char *item = quote ? ts__printable(items[shown], nb, sizeof nb) : items[shown];
        size_t need = strlen(item) + (quote ? 2 : 0) + (shown ? strlen(sep) : 0);
        size_t reserve = shown + 1 < n ? sizeof more : 0; /* room to say how many are left */
        if (k + need + reserve > end) break;
        k += (size_t)snprintf(buf + k, cap - k, "%s%s%s%s", shown ? sep : "", quote ? "'" : "", item, quote ? "'" : "");
    }
    if (shown < n) {
        snprintf(more, sizeof more, "%s... and %d more", shown ? sep : "", n - shown);
        if (k + strlen(more) <= end) k += (size_t)snprintf(buf + k, cap - k, "%s", more);
    }
    *len = k;
}

/* The message for every problem found, and its status: TS_ERR_SHAPE when a shape differs, else
 * TS_ERR_DTYPE when a dtype does, else TS_ERR_INVALID_ARG (missing or unexpected keys). sd_model and
 * model: the zoo models sd came from and m is (NULL: unknown). */
static ts_status report_problems(const load_problems *pb, const ts_tensor_list *sd, const unsigned char *seen,
                                 const char *sd_model, const char *model) {
    int nunexpected = 0;
    for (int i = 0; i < sd->n; i++) nunexpected += !seen[i];
    ts_status s = pb->nshape ? TS_ERR_SHAPE : pb->ndtype ? TS_ERR_DTYPE : TS_ERR_INVALID_ARG;
    if (sd_model && model && strcmp(sd_model, model) != 0) {
        char a[80], b[80], counts[160] = "";
        size_t k = 0;
        if (pb->nmissing)
            k += (size_t)snprintf(counts + k, sizeof counts - k, "%d of the model's keys missing", pb->nmissing);
        if (nunexpected)
            k += (size_t)snprintf(counts + k, sizeof counts - k, "%s%d unexpected", k ? ", " : "", nunexpected);
        if (pb->nmismatch)
            snprintf(counts + k, sizeof counts - k, "%s%d of another shape or dtype", k ? ", " : "", pb->nmismatch);
        return ts_error(s, "load_state_dict: this is a %s checkpoint; the model is %s (%s)",
                        ts__printable(sd_model, a, sizeof a), ts__printable(model, b, sizeof b), counts);
    }
    char **unexpected = ts__malloc(sizeof *unexpected * (size_t)(nunexpected ? nunexpected : 1));
    if (!unexpected) return TS_ERR_NOMEM;
    for (int i = 0, k = 0; i < sd->n; i++)
        if (!seen[i]) unexpected[k++] = sd->names[i];
    /* the kinds present: head, items, count, quoted, separator */
    struct {
        char head[96];
        char **items;
        int n;
        bool quote;
        const char *sep;
    } kind[3];
    int nk = 0;
    if (pb->nmissing) {
        snprintf(kind[nk].head, sizeof kind[nk].head, " %d missing key%s in the state dict: ", pb->nmissing,
                 pb->nmissing == 1 ? "" : "s");
        kind[nk].items = pb->missing, kind[nk].n = pb->nmissing, kind[nk].quote = true, kind[nk++].sep = ", ";
    }
    if (nunexpected) {
        snprintf(kind[nk].head, sizeof kind[nk].head, "%s %d unexpected key%s in the state dict: ", nk ? ";" : "",
                 nunexpected, nunexpected == 1 ? "" : "s");
        kind[nk].items = unexpected, kind[nk].n = nunexpected, kind[nk].quote = true, kind[nk++].sep = ", ";
    }
    if (pb->nmismatch) {
        snprintf(kind[nk].head, sizeof kind[nk].head, "%s %d tensor%s of another shape or dtype: ", nk ? ";" : "",
                 pb->nmismatch, pb->nmismatch == 1 ? "" : "s");
        kind[nk].items = pb->mismatch, kind[nk].n = pb->nmismatch, kind[nk].quote = false, kind[nk++].sep = "; ";
    }
    char msg[LOAD_MSG_MAX], scratch[LOAD_MSG_MAX];
    size_t need[3];
    for (int k = 0; k < nk; k++) { /* each kind's length on its own (at most LOAD_LIST_MAX names) */
        need[k] = 0;
        list_problems(scratch, &need[k], sizeof scratch, sizeof scratch - 1, kind[k].head, kind[k].items, kind[k].n,
                      kind[k].quote, kind[k].sep);
    }
    int total = pb->nmissing + nunexpected + pb->nmismatch;
    size_t len = (size_t)snprintf(msg, sizeof msg, "load_state_dict: %d problem%s:", total, total == 1 ? "" : "s");
    for (int k = 0; k < nk; k++) {
        /* leave the later kinds what they need, or an equal share of the room when that is less */
        size_t room = sizeof msg - 1 - len, later = 0;
        for (int j = k + 1; j < nk; j++) later += TS_MIN(need[j], room / (size_t)(nk - k));
        list_problems(msg, &len, sizeof msg, room - TS_MIN(later, room), kind[k].head, kind[k].items, kind[k].n,
                      kind[k].quote, kind[k].sep);
    }
    free(unexpected);
    return ts_error(s, "%s", msg);
}

const char *ts_module_model_name(const ts_module *m) { return m ? m->model_name : NULL; }

ts_status ts_module_load_state_dict(ts_module *m, const ts_tensor_list *sd, bool strict) {
    return ts_module_load_state_dict_from(m, sd, strict, NULL);
}

ts_status ts_module_load_state_dict_from(ts_module *m, const ts_tensor_list *sd, bool strict, const char *sd_model) {
    TS_ARG(m && sd, "ts_module_load_state_dict: NULL argument");
    load_problems pb = {0};
    load_ctx c = {sd, strict, false, NULL, &pb};
    c.seen = ts__calloc((size_t)(sd->n ? sd->n : 1), 1);
    if (!c.seen) return TS_ERR_NOMEM;
    /* pass 1: check every key, shape and dtype; pass 2: copy */
    ts_status st = walk_root(m, WALK_PARAMS | WALK_BUFFERS, load_fn, &c);
    bool unexpected = false;
    for (int i = 0; strict && i < sd->n; i++) unexpected |= !c.seen[i];
    if (st == TS_OK && (pb.nmissing || pb.nmismatch || unexpected)) {
        if (!strict) memset(c.seen, 1, (size_t)sd->n); /* not strict: only mismatches are reported */
        st = report_problems(&pb, sd, c.seen, sd_model, m->model_name);
    }
    if (st == TS_OK) {
        bool prev = ts_grad_set_enabled(false);
        c.copy = true;
        st = walk_root(m, WALK_PARAMS | WALK_BUFFERS, load_fn, &c);
        ts_grad_set_enabled(prev);
    }
    for (int i = 0; i < pb.nmissing; i++) free(pb.missing[i]);
    for (int i = 0; i < pb.nmismatch; i++) free(pb.mismatch[i]);
    free(pb.missing);
    free(pb.mismatch);
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

/* ---- a second tree over the same tensors (ts_run trains a module it does not own) ------------------------------- */
static ts_status share_tree(ts_module *src, ts_module **out) {
    ts_module *r = NULL;
    ts_status st = TS_OK;
    *out = NULL;
    TS_TRY(ts__module_new_replica(src, &r)); /* src's type and configuration (borrowed) */
    r->model_name = src->model_name;
    for (int i = 0; i < src->nparams; i++) {
        r->param_names[i] = src->param_names[i]; /* static, or src's configuration's */
        r->params[i] = src->params[i] ? ts_tensor_retain(src->params[i]) : NULL;
        r->nparams = i + 1;
    }
    for (int i = 0; i < src->nbuffers; i++) {
        r->buffer_names[i] = src->buffer_names[i];
        r->buffers[i] = src->buffers[i] ? ts_tensor_retain(src->buffers[i]) : NULL;
        r->nbuffers = i + 1;
    }
    for (int i = 0; i < src->nchildren; i++) {
        ts_module *c = NULL;
        TS_CHECK_GOTO(share_tree(src->children[i], &c));
        TS_CHECK_GOTO(ts__module_add_child(r, src->child_names[i], c));
    }
    *out = r;
    return TS_OK;
fail:
    ts_module_free(r);
    return st;
}

ts_status ts_module_share(ts_module *m, ts_module **out) {
    TS_ARG(m && out, "ts_module_share: NULL argument");
    return share_tree(m, out);
}
