/*
 * nn/module.h — the module struct (internal).
 *
 * A module is a small vtable (type name, forward, free of the type's extra
 * state) plus generic storage the core walks for every type: named
 * parameter slots, named buffer slots and named children. A slot may hold
 * NULL (a Linear without bias, a BatchNorm2d without affine): such slots are
 * skipped by every enumeration, as PyTorch skips parameters registered as None.
 * Layers read their tensors through the slots on every forward, so
 * ts_module_to can replace them.
 */
#ifndef TS_NN_MODULE_H
#define TS_NN_MODULE_H

#include "tensor/tensor.h"
#include "tessera/nn.h"

#define TS_MODULE_MAX_SLOTS 4

typedef struct ts_module_vt {
    const char *name; /* type name, static */
    ts_status (*forward)(ts_module *m, const ts_tensor *x, ts_tensor **out);
    /* frees what the type keeps in m->impl besides the plain allocation (optional) */
    void (*free_impl)(ts_module *m);
} ts_module_vt;

struct ts_module {
    const ts_module_vt *vt;
    bool training;

    int nparams, nbuffers;
    const char *param_names[TS_MODULE_MAX_SLOTS];  /* static strings */
    ts_tensor *params[TS_MODULE_MAX_SLOTS];        /* owned references or NULL */
    const char *buffer_names[TS_MODULE_MAX_SLOTS];
    ts_tensor *buffers[TS_MODULE_MAX_SLOTS];

    int nchildren, cap_children;
    char **child_names;    /* owned copies */
    ts_module **children;  /* owned */

    void *impl; /* type-specific configuration (ts__calloc'd, freed by the core) */
    /* impl is borrowed from the module this one replicates (src/parallel/
     * data_parallel.c, ts_replicate): read-only configuration shared as PyTorch's
     * replicas share their module's attributes; not freed with this module. */
    bool impl_borrowed;
};

/* A new module of type vt with impl_size zeroed bytes of configuration; training mode. */
ts_status ts__module_new(const ts_module_vt *vt, size_t impl_size, ts_module **out);
/* Registers a parameter slot; takes ownership of the reference t (may be NULL) and sets requires_grad. */
void ts__module_add_param(ts_module *m, const char *name, ts_tensor *t);
/* Registers a buffer slot; takes ownership of the reference t (may be NULL). */
void ts__module_add_buffer(ts_module *m, const char *name, ts_tensor *t);
/* Appends a named child; takes ownership of child (freed on failure). name NULL: the index. */
ts_status ts__module_add_child(ts_module *m, const char *name, ts_module *child);

/* BatchNorm2d's configuration (src/parallel/syncbn.c converts BatchNorm2d
 * modules in place): false, outputs untouched, when m is not a BatchNorm2d. */
bool ts__batchnorm2d_config(const ts_module *m, float *eps, float *momentum, bool *track_running_stats);

/* A new CPU F32 tensor filled with U(-bound, bound). */
ts_status ts__param_uniform(int ndim, const int64_t *shape, double bound, ts_rng *rng, ts_tensor **out);

#endif
