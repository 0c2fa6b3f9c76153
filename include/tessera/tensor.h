/*
 * tessera/tensor.h — n-dimensional tensors and reverse-mode autograd.
 *
 * A tensor is a refcounted view (dtype, shape, strides, offset) of a refcounted
 * storage that lives on one device. Creating functions hand the caller one
 * reference; ts_tensor_release drops it. Ops never take ownership of inputs.
 *
 * Autograd: a tensor with requires_grad set is a leaf; ops on tensors that
 * require grad record a graph node (unless grad mode is off on this thread).
 * ts_backward(loss) runs the graph in reverse creation order, accumulates
 * gradients into leaves' .grad, fires each leaf's grad-ready hooks once its
 * gradient for this pass is final, and frees the graph's saved tensors.
 */
#ifndef TESSERA_TENSOR_H
#define TESSERA_TENSOR_H

#include "core.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TS_MAX_DIMS 8

typedef struct ts_tensor ts_tensor;

/* ---- creation (each returns a new reference in *out) ---------------------------- */
ts_status ts_tensor_empty(ts_device *dev, ts_dtype dt, int ndim, const int64_t *shape, ts_tensor **out);
ts_status ts_tensor_zeros(ts_device *dev, ts_dtype dt, int ndim, const int64_t *shape, ts_tensor **out);
ts_status ts_tensor_full(ts_device *dev, int ndim, const int64_t *shape, float value, ts_tensor **out);
/* Copies nbytes = numel * dtype size from host memory `data`. */
ts_status ts_tensor_from_data(ts_device *dev, ts_dtype dt, int ndim, const int64_t *shape, const void *data,
                              ts_tensor **out);
/* Uniform in [lo, hi) / normal(mean, std) from rng (NULL: the default generator). F32 only. */
ts_status ts_tensor_uniform_(ts_tensor *t, float lo, float hi, ts_rng *rng);
ts_status ts_tensor_normal_(ts_tensor *t, float mean, float std, ts_rng *rng);
ts_status ts_tensor_fill_(ts_tensor *t, float value);
/* A contiguous copy on the same device; no autograd. */
ts_status ts_tensor_clone(const ts_tensor *t, ts_tensor **out);
/* Copies src's values into dst (same shape and dtype; devices may differ); no autograd. */
ts_status ts_tensor_copy_(ts_tensor *dst, const ts_tensor *src);
/* A new tensor sharing t's storage with no autograd history. */
ts_status ts_tensor_detach(const ts_tensor *t, ts_tensor **out);

ts_tensor *ts_tensor_retain(ts_tensor *t); /* returns t */
void ts_tensor_release(ts_tensor *t);      /* NULL is fine */

/* ---- properties ---------------------------------------------------------------------- */
int ts_tensor_ndim(const ts_tensor *t);
int64_t ts_tensor_dim(const ts_tensor *t, int i); /* negative i counts from the end */
const int64_t *ts_tensor_shape(const ts_tensor *t); /* borrowed, ndim entries */
const int64_t *ts_tensor_strides(const ts_tensor *t);
int64_t ts_tensor_numel(const ts_tensor *t);
size_t ts_tensor_nbytes(const ts_tensor *t);
ts_dtype ts_tensor_dtype(const ts_tensor *t);
ts_device *ts_tensor_device(const ts_tensor *t);
bool ts_tensor_is_contiguous(const ts_tensor *t);
/* Writes "[2, 3, 4]" into buf; returns buf. */
const char *ts_shape_str(int ndim, const int64_t *shape, char *buf, size_t n);

/* Host pointer to the first element of a CPU tensor (NULL for other devices). Borrowed. */
void *ts_tensor_data(ts_tensor *t);
/* The address of the first element on the tensor's device, whatever the device (a CUDA device pointer for
 * cuda:N tensors: not dereferenceable on the host; no synchronisation), as torch.Tensor.data_ptr(). */
void *ts_tensor_address(const ts_tensor *t);
float *ts_tensor_data_f32(ts_tensor *t);
/* Copies the tensor's values (contiguous order) to/from host memory. */
ts_status ts_tensor_to_host(const ts_tensor *t, void *dst, size_t nbytes);
ts_status ts_tensor_from_host(ts_tensor *t, const void *src, size_t nbytes);
/* Reads one element as double (any device; slow). */
double ts_tensor_item(const ts_tensor *t, int64_t flat_index);

/* ---- autograd ------------------------------------------------------------------------------ */
void ts_tensor_set_requires_grad(ts_tensor *t, bool on);
bool ts_tensor_requires_grad(const ts_tensor *t);
bool ts_tensor_is_leaf(const ts_tensor *t);
/* The accumulated gradient of a leaf, or NULL. Borrowed. */
ts_tensor *ts_tensor_grad(ts_tensor *t);
/* Replaces the gradient (retains g; NULL clears it). */
void ts_tensor_set_grad(ts_tensor *t, ts_tensor *g);
/* Sets .grad to NULL (set_to_none semantics). */
void ts_tensor_zero_grad(ts_tensor *t);
/* Optional name for error messages and state dicts (copied). */
void ts_tensor_set_name(ts_tensor *t, const char *name);
const char *ts_tensor_name(const ts_tensor *t);

/* Backpropagates from `root`. grad may be NULL when root has one element (then 1).
 * retain_graph keeps saved tensors so the graph can be run again. */
ts_status ts_backward(ts_tensor *root, ts_tensor *grad, bool retain_graph);

/* Grad mode is per thread and on by default. Returns the previous mode. */
bool ts_grad_set_enabled(bool on);
bool ts_grad_is_enabled(void);

/* Called during ts_backward once leaf `t`'s gradient for this pass is final and
 * accumulated into ts_tensor_grad(t). Hooks run on the backward thread in the
 * order the gradients become ready (reverse order of use in forward). */
typedef void (*ts_grad_ready_fn)(ts_tensor *t, void *user);
/* Returns a handle id (>0) for removal. */
int ts_tensor_add_grad_ready_hook(ts_tensor *t, ts_grad_ready_fn fn, void *user);
void ts_tensor_remove_grad_ready_hook(ts_tensor *t, int id);

/* ---- named tensor lists (state dicts, checkpoints, optimizer state) ------------------------ */
typedef struct ts_tensor_list {
    int n, cap;
    char **names;        /* owned copies */
    ts_tensor **tensors; /* owned references */
} ts_tensor_list;

#define TS_TENSOR_LIST_INIT ((ts_tensor_list){0, 0, NULL, NULL})
/* Appends (name, t): copies name, retains t. */
ts_status ts_tensor_list_append(ts_tensor_list *l, const char *name, ts_tensor *t);
/* The tensor named `name`, or NULL. Borrowed. */
ts_tensor *ts_tensor_list_find(const ts_tensor_list *l, const char *name);
/* Releases every entry and the arrays; leaves an empty list. */
void ts_tensor_list_clear(ts_tensor_list *l);

#ifdef __cplusplus
}
#endif
#endif /* TESSERA_TENSOR_H */
