/*
 * nn/custom.c — modules of your own: PyTorch's nn.Module subclass in C.
 *
 * A custom module is the generic module (slots and children, which every walk
 * already handles) plus the user's forward function and context. Its type name
 * and its slot names are copies it owns (in impl), so they may come from
 * anywhere; a replica made by ts_replicate borrows them with the impl. Kind:
 * TS_MODULE_CUSTOM, so code that switches on kinds (tile parallelism) refuses
 * it by name instead of guessing at its structure.
 */
#include "nn/module.h"

#include <stdio.h>

typedef struct custom_impl {
    ts_module_forward_fn forward;
    void *ctx;
    void (*free_ctx)(void *ctx);
    ts_module_vt vt;  /* this module's own table: the type name is the user's */
    char *type_name;
    char *names[2][TS_MODULE_MAX_SLOTS]; /* [0] parameters, [1] buffers: owned copies */
} custom_impl;

static ts_status custom_forward(ts_module *m, const ts_tensor *x, ts_tensor **out) {
    const custom_impl *c = m->impl;
    *out = NULL;
    ts_status st = c->forward(m, x, out);
    if (st == TS_OK && !*out)
        return ts_error(TS_ERR_INTERNAL, "%s: the forward function returned TS_OK without an output", c->type_name);
    if (st != TS_OK) {
        ts_tensor_release(*out);
        *out = NULL;
    }
    return st;
}

static void custom_free_impl(ts_module *m) {
    custom_impl *c = m->impl;
    if (!c) return;
    if (c->free_ctx) c->free_ctx(c->ctx);
    free(c->type_name);
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < TS_MODULE_MAX_SLOTS; i++) free(c->names[k][i]);
}

static bool is_custom(const ts_module *m) { return m && m->vt->forward == custom_forward; }

ts_status ts_nn_module_new(const char *type_name, ts_module_forward_fn forward, void *ctx, void (*free_ctx)(void *),
                           ts_module **out) {
    TS_ARG(out && forward, "ts_nn_module_new: NULL %s", out ? "forward function" : "out");
    *out = NULL;
    if (!type_name || !type_name[0]) type_name = "Module";
    custom_impl *c = ts__calloc(1, sizeof *c);
    char *name = ts__strdup(type_name);
    ts_module *m = NULL;
    if (!c || !name) goto nomem;
    c->forward = forward;
    c->ctx = ctx;
    c->type_name = name;
    c->vt = (ts_module_vt){.name = name, .kind = TS_MODULE_CUSTOM, .forward = custom_forward,
                           .free_impl = custom_free_impl};
    c->free_ctx = free_ctx;
    if (ts__module_new(&c->vt, 0, &m) != TS_OK) goto nomem;
    m->impl = c;
    *out = m;
    return TS_OK;
nomem:
    free(name);
    free(c);
    if (free_ctx) free_ctx(ctx);
    return ts_error(TS_ERR_NOMEM, "ts_nn_module_new: out of memory");
}

void *ts_module_ctx(const ts_module *m) { return is_custom(m) ? ((const custom_impl *)m->impl)->ctx : NULL; }

enum { SLOT_PARAM, SLOT_BUFFER, SLOT_CHILD };

/* Checks that m is a custom module and `name` a new, valid local name for a slot of `what`. */
static ts_status check_slot_name(const char *fn, const ts_module *m, const char *name, int what) {
    if (!is_custom(m))
        return ts_error(TS_ERR_INVALID_ARG, "%s: %s is not a module made by ts_nn_module_new", fn,
                        m ? ts_module_type_name(m) : "NULL");
    if (!name || !name[0] || strchr(name, '.'))
        return ts_error(TS_ERR_INVALID_ARG, "%s: %s: name '%s' is empty or contains '.'", fn, m->vt->name,
                        name ? name : "(null)");
    for (int i = 0; i < m->nparams; i++)
        if (!strcmp(m->param_names[i], name))
            return ts_error(TS_ERR_INVALID_ARG, "%s: %s already has a parameter '%s'", fn, m->vt->name, name);
    for (int i = 0; i < m->nbuffers; i++)
        if (!strcmp(m->buffer_names[i], name))
            return ts_error(TS_ERR_INVALID_ARG, "%s: %s already has a buffer '%s'", fn, m->vt->name, name);
    for (int i = 0; i < m->nchildren; i++)
        if (!strcmp(m->child_names[i], name))
            return ts_error(TS_ERR_INVALID_ARG, "%s: %s already has a child '%s'", fn, m->vt->name, name);
    if (what != SLOT_CHILD && (what == SLOT_PARAM ? m->nparams : m->nbuffers) == TS_MODULE_MAX_SLOTS)
        return ts_error(TS_ERR_INVALID_ARG, "%s: %s: '%s': a module holds at most %d %s; put more in child modules",
                        fn, m->vt->name, name, TS_MODULE_MAX_SLOTS, what == SLOT_PARAM ? "parameters" : "buffers");
    return TS_OK;
}

static ts_status add_slot(const char *fn, ts_module *m, const char *name, ts_tensor *t, bool param) {
    ts_status st = check_slot_name(fn, m, name, param ? SLOT_PARAM : SLOT_BUFFER);
    if (st == TS_OK && param && t && ts_tensor_dtype(t) != TS_F32)
        st = ts_error(TS_ERR_DTYPE, "%s: %s: parameter '%s' must be float32, not %s", fn, m->vt->name, name,
                      ts_dtype_name(ts_tensor_dtype(t)));
    if (st != TS_OK) {
        ts_tensor_release(t);
        return st;
    }
    custom_impl *c = m->impl;
    int k = param ? 0 : 1, i = param ? m->nparams : m->nbuffers;
    char *copy = ts__strdup(name);
    if (!copy) {
        ts_tensor_release(t);
        return ts_error(TS_ERR_NOMEM, "%s: out of memory", fn);
    }
    free(c->names[k][i]);
    c->names[k][i] = copy;
    return param ? ts__module_add_param(m, copy, t) : ts__module_add_buffer(m, copy, t);
}

ts_status ts_module_add_parameter(ts_module *m, const char *name, ts_tensor *t) {
    return add_slot("ts_module_add_parameter", m, name, t, true);
}

ts_status ts_module_add_buffer(ts_module *m, const char *name, ts_tensor *t) {
    return add_slot("ts_module_add_buffer", m, name, t, false);
}

ts_status ts_module_add_child(ts_module *m, const char *name, ts_module *child) {
    char idx[24];
    if (!name && is_custom(m)) { /* its index, as Sequential names children */
        snprintf(idx, sizeof idx, "%d", m->nchildren);
        name = idx;
    }
    ts_status st = check_slot_name("ts_module_add_child", m, name, SLOT_CHILD);
    if (st == TS_OK && !child) st = ts_error(TS_ERR_INVALID_ARG, "ts_module_add_child: NULL child '%s'", name);
    if (st != TS_OK) {
        ts_module_free(child);
        return st;
    }
    return ts__module_add_child(m, name, child);
}

/* The slot of m (any module) named `name` among its own parameters or buffers. */
static ts_tensor *find_slot(const ts_module *m, const char *name, bool param) {
    if (!m || !name) return NULL;
    int n = param ? m->nparams : m->nbuffers;
    for (int i = 0; i < n; i++)
        if (!strcmp(param ? m->param_names[i] : m->buffer_names[i], name)) return param ? m->params[i] : m->buffers[i];
    return NULL;
}

ts_tensor *ts_module_param(const ts_module *m, const char *name) { return find_slot(m, name, true); }
ts_tensor *ts_module_buffer(const ts_module *m, const char *name) { return find_slot(m, name, false); }

ts_status ts_module_call(ts_module *m, const char *path, const ts_tensor *x, ts_tensor **out) {
    TS_ARG(m && path && x && out, "ts_module_call: NULL argument");
    *out = NULL;
    ts_module *c = ts_module_child(m, path);
    if (!c)
        return ts_error(TS_ERR_INVALID_ARG, "ts_module_call: %s has no child '%s'", ts_module_type_name(m), path);
    ts_status st = ts_module_forward(c, x, out);
    if (st != TS_OK) return ts__error_prefix(st, "%s '%s'", ts_module_type_name(c), path);
    return TS_OK;
}
