/*
 * tensor/tensor.h — the tensor and storage structs (internal).
 *
 * Ownership: a tensor holds one reference to its storage and, when it is the
 * result of a recorded op, one reference to its grad_fn node. A leaf that
 * requires grad owns its accumulate node (grad_acc); that node points back at
 * the leaf weakly, and the leaf has it cleared when it dies (through the
 * autograd hooks below: this layer does not include autograd's headers).
 */
#ifndef TS_TENSOR_INTERNAL_H
#define TS_TENSOR_INTERNAL_H

#include "device/device.h"

typedef struct ts_storage {
    _Atomic int refcount;
    ts_device *device;
    void *data;
    size_t nbytes;
    /* memory another framework owns (DLPack): when the last reference goes, release(release_ctx) is
     * called instead of the device's free (NULL: the device's allocator owns data) */
    void (*release)(void *ctx);
    void *release_ctx;
} ts_storage;

struct ts_node;

typedef struct ts_hook {
    int id;
    ts_grad_ready_fn fn;
    void *user;
} ts_hook;

struct ts_tensor {
    _Atomic int refcount;
    ts_dtype dtype;
    int ndim;
    int64_t shape[TS_MAX_DIMS];
    int64_t stride[TS_MAX_DIMS]; /* in elements */
    int64_t offset;              /* in elements */
    ts_storage *storage;

    /* autograd */
    bool requires_grad;
    ts_tensor *grad;
    struct ts_node *grad_fn;  /* producer (non-leaf), owned reference */
    struct ts_node *grad_acc; /* accumulate node (leaf), owned reference, lazily created */
    ts_hook *hooks;
    int nhooks, next_hook_id;
    char *name;
};

/* Pointer to element 0 (device address). */
static inline void *ts__ptr(const ts_tensor *t) {
    return (char *)t->storage->data + (size_t)t->offset * ts_dtype_size(t->dtype);
}
static inline float *ts__f32(const ts_tensor *t) { return (float *)ts__ptr(t); }

/* ---- the autograd layer's hooks ------------------------------------------------------
 * The tensor layer sits below autograd and does not know what a node is (as
 * PyTorch's c10 TensorImpl reaches autograd only through AutogradMetaInterface).
 * A dying tensor hands its nodes back through these hooks, which autograd
 * installs before it creates its first node, so any tensor holding a node finds
 * them set. */
typedef struct ts__autograd_hooks {
    void (*release_node)(struct ts_node *n);     /* drops a reference to a node (grad_fn) */
    void (*release_leaf)(struct ts_node *acc);   /* the owning leaf of accumulate node acc dies:
                                                    clear acc's weak pointer to it, drop the reference */
} ts__autograd_hooks;
void ts__tensor_set_autograd_hooks(const ts__autograd_hooks *h);

int64_t ts__numel(int ndim, const int64_t *shape);
/* A new contiguous tensor with no data initialisation (same as ts_tensor_empty). */
ts_status ts__new(ts_device *dev, ts_dtype dt, int ndim, const int64_t *shape, ts_tensor **out);
/* Kernel scratch: a 1-D F32 tensor of max(n, 1) floats on dev, from its allocator (the CPU's caching
 * one recycles a training step's buffers); uninitialised. */
ts_status ts__scratch_f32(ts_device *dev, int64_t n, ts_tensor **out);
/* The same, for at least `bytes` bytes (any data: ts__ptr gives the buffer). */
ts_status ts__scratch_bytes(ts_device *dev, size_t bytes, ts_tensor **out);
/* A new contiguous tensor shaped like t. */
ts_status ts__new_like(const ts_tensor *t, ts_tensor **out);
ts_status ts__zeros_like(const ts_tensor *t, ts_tensor **out);
/* A tensor over memory it does not own: data (nbytes from it, on dev) seen as dtype dt, shape and strides
 * (elements; NULL: contiguous). When the last tensor over it dies, release(ctx) is called (not on failure).
 * The caller checked that every element lies within the nbytes. */
ts_status ts__tensor_wrap(ts_device *dev, ts_dtype dt, int ndim, const int64_t *shape, const int64_t *strides,
                          void *data, size_t nbytes, void (*release)(void *ctx), void *ctx, ts_tensor **out);
/* A view over t's storage with a new shape (contiguous strides); no autograd. */
ts_status ts__view(const ts_tensor *t, int ndim, const int64_t *shape, ts_tensor **out);
/* Returns a new reference to t if contiguous, else a contiguous copy; no autograd. */
ts_status ts__contiguous(const ts_tensor *t, ts_tensor **out);
bool ts__same_shape(const ts_tensor *a, const ts_tensor *b);

/* Argument checks with errors that name the op and the shapes. */
ts_status ts__check_f32(const char *op, const char *arg, const ts_tensor *t);
ts_status ts__check_ndim(const char *op, const char *arg, const ts_tensor *t, int ndim);
ts_status ts__check_same_device(const char *op, const ts_tensor *a, const ts_tensor *b);

#endif
