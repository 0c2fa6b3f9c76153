/*
 * parallel/data_parallel.c — torch.nn.parallel's data-parallel primitives
 * (replicate, scatter, gather, parallel_apply), data_parallel and the
 * DataParallel module (see include/tessera/parallel.h).
 *
 * The primitives are compositions of recorded ops (ts_to_device, ts_slice,
 * ts_concat), so autograd follows them like any other op; a backward through
 * them runs on the calling thread.
 *
 * ts_data_parallel is one autograd node, "DataParallel", whose inputs are x and
 * the module's P parameters (so a node with 1 + P inputs: the engine keeps the
 * first eight inline and the rest on the heap):
 *
 *   forward   1. replicate: per used device a replica whose parameters are
 *               detached LEAF copies (devs[0]: aliases of the module's own
 *               storage; others: copies made on the device's worker), so each
 *               replica's graph is a separate graph;
 *             2. on every device's worker at once: copy its rows of x to the
 *               device (a leaf that requires grad when x does), run the replica;
 *             3. gather the outputs into one tensor on the output device;
 *             4. record the node; the replicas, their inputs and outputs (the
 *               roots of their graphs) live in the node's ctx.
 *   backward  1. on every device's worker at once: copy its rows of the output
 *               gradient to the device and ts_backward(replica output, rows) —
 *               graphs are disjoint, so these passes run concurrently (see
 *               src/autograd/autograd.c), with the outer pass's retain_graph;
 *             2. gin[1 + j] = sum over replicas of parameter j's gradient, on
 *               the parameter's device (devs[0]): the replicas' leaves' .grad
 *               are taken (stolen) so a retained graph can run again;
 *             3. gin[0] = the chunks' input gradients placed in x's rows, on x's
 *               device.
 *   The node's ctx is freed with the node (after backward unless retained).
 */
#include "autograd/autograd.h"
#include "core/timeline.h"
#include "nn/module.h"
#include "tensor/tensor.h"
#include "device/k_ew.h"
#include "tessera/parallel.h"

#include <stdio.h>

#define DP_MAX_DEVICES 64

/* ---- helpers ----------------------------------------------------------------------------------- */
int ts_chunk_sizes(int64_t size, int chunks, int64_t *sizes) {
    if (chunks < 1 || size < 0 || !sizes) return 0;
    if (size == 0) { /* torch.chunk of an empty dim: `chunks` empty pieces */
        for (int i = 0; i < chunks; i++) sizes[i] = 0;
        return chunks;
    }
    int64_t per = (size + chunks - 1) / chunks;
    int count = (int)((size + per - 1) / per);
    for (int i = 0; i < count; i++) sizes[i] = TS_MIN(per, size - (int64_t)i * per);
    return count;
}

/* devs[0..n) non-NULL and distinct. */
static ts_status check_devices(const char *fn, ts_device *const *devs, int n) {
    TS_ARG(devs, "%s: NULL device list", fn);
    TS_ARG(n >= 1, "%s: need at least one device, got %d", fn, n);
    TS_ARG(n <= DP_MAX_DEVICES, "%s: %d devices, at most %d", fn, n, DP_MAX_DEVICES);
    for (int i = 0; i < n; i++) {
        TS_ARG(devs[i], "%s: device %d is NULL", fn, i);
        for (int k = 0; k < i; k++)
            if (devs[k] == devs[i])
                return ts_error(TS_ERR_INVALID_ARG, "%s: device %s appears twice in the device list (at %d and %d)",
                                fn, devs[i]->name, k, i);
    }
    return TS_OK;
}

/* Every parameter and buffer of m on dev (PyTorch's DataParallel check). */
static ts_status check_module_on(const char *fn, ts_module *m, ts_device *dev) {
    ts_tensor_list l = TS_TENSOR_LIST_INIT;
    ts_status st = ts_module_state_dict(m, &l);
    for (int i = 0; st == TS_OK && i < l.n; i++) {
        ts_device *d = l.tensors[i]->storage->device;
        if (d != dev)
            st = ts_error(TS_ERR_DEVICE,
                          "%s: the module must have its parameters and buffers on device %s (devs[0]) but '%s' is on "
                          "%s; move it first (ts_module_to)",
                          fn, dev->name, l.names[i], d->name);
    }
    ts_tensor_list_clear(&l);
    return st;
}

/* A view of rows [start, start + len) of t along dim 0 (no copy, no autograd). */
static ts_status row_view(const ts_tensor *t, int64_t start, int64_t len, ts_tensor **out) {
    TS_TRY(ts_tensor_detach(t, out));
    (*out)->shape[0] = len;
    if (len > 0) (*out)->offset += start * t->stride[0];
    return TS_OK;
}

/* A contiguous copy of rows [start, start + len) of t on dev (a view when t is already there). */
static ts_status rows_to(const ts_tensor *t, int64_t start, int64_t len, ts_device *dev, ts_tensor **out) {
    ts_tensor *v = NULL, *o = NULL;
    TS_TRY(row_view(t, start, len, &v));
    if (v->storage->device == dev) {
        *out = v;
        return TS_OK;
    }
    ts_status st = ts__new(dev, v->dtype, v->ndim, v->shape, &o);
    if (st == TS_OK) st = ts_tensor_copy_(o, v);
    ts_tensor_release(v);
    if (st != TS_OK) {
        ts_tensor_release(o);
        return st;
    }
    *out = o;
    return TS_OK;
}

/* True when m or a descendant is a Dropout in training mode (its generator is shared). */
static bool has_training_dropout(const ts_module *m) {
    if (m->training && ts_module_kind(m) == TS_MODULE_DROPOUT) return true;
    for (int i = 0; i < m->nchildren; i++)
        if (has_training_dropout(m->children[i])) return true;
    return false;
}

/* ---- replication --------------------------------------------------------------------------------- */
typedef enum {
    REP_AUTOGRAD, /* parameters: ts_to_device(p, dev) (Broadcast: backward sums into p) */
    REP_LEAVES,   /* parameters: new leaves; same device: aliases; else empty, filled by the caller */
} rep_mode;

/* A copy of tensor t on dev without autograd (t itself when already there). */
static ts_status plain_copy(ts_tensor *t, ts_device *dev, ts_tensor **out) {
    if (t->storage->device == dev) {
        *out = ts_tensor_retain(t);
        return TS_OK;
    }
    TS_TRY(ts__new(dev, t->dtype, t->ndim, t->shape, out));
    ts_status st = ts_tensor_copy_(*out, t);
    if (st != TS_OK) {
        ts_tensor_release(*out);
        *out = NULL;
    }
    return st;
}

static ts_status replicate_tree(ts_module *src, ts_device *dev, rep_mode mode, ts_module **out) {
    ts_module *r = NULL;
    ts_status st;
    *out = NULL;
    TS_TRY(ts__module_new_replica(src, &r)); /* src's type, sharing its configuration */
    for (int i = 0; i < src->nparams; i++) {
        ts_tensor *p = src->params[i], *c = NULL;
        r->param_names[i] = src->param_names[i];
        r->nparams = i + 1;
        if (!p) continue;
        if (mode == REP_AUTOGRAD) {
            TS_CHECK_GOTO(ts_to_device(p, dev, &c));
        } else {
            if (p->storage->device == dev)
                TS_CHECK_GOTO(ts_tensor_detach(p, &c));
            else
                TS_CHECK_GOTO(ts__new(dev, p->dtype, p->ndim, p->shape, &c)); /* filled on dev's worker */
            ts_tensor_set_requires_grad(c, p->requires_grad);
        }
        r->params[i] = c;
    }
    for (int i = 0; i < src->nbuffers; i++) {
        ts_tensor *b = src->buffers[i], *c = NULL;
        r->buffer_names[i] = src->buffer_names[i];
        r->nbuffers = i + 1;
        if (!b) continue;
        if (mode == REP_AUTOGRAD && b->requires_grad)
            TS_CHECK_GOTO(ts_to_device(b, dev, &c));
        else
            TS_CHECK_GOTO(plain_copy(b, dev, &c)); /* on the source's device: the buffer itself */
        r->buffers[i] = c;
    }
    for (int i = 0; i < src->nchildren; i++) {
        ts_module *c = NULL;
        TS_CHECK_GOTO(replicate_tree(src->children[i], dev, mode, &c));
        TS_CHECK_GOTO(ts__module_add_child(r, src->child_names[i], c));
    }
    *out = r;
    return TS_OK;
fail:
    ts_module_free(r);
    return st;
}

ts_status ts_replicate(ts_module *module, ts_device *const *devs, int n, ts_module **replicas) {
    TS_ARG(module && replicas, "ts_replicate: NULL argument");
    TS_TRY(check_devices("ts_replicate", devs, n));
    for (int i = 0; i < n; i++) replicas[i] = NULL;
    TS_TRY(check_module_on("ts_replicate", module, devs[0]));
    for (int i = 0; i < n; i++) {
        ts_status st = replicate_tree(module, devs[i], REP_AUTOGRAD, &replicas[i]);
        if (st != TS_OK) {
            for (int k = 0; k < i; k++) {
                ts_module_free(replicas[k]);
                replicas[k] = NULL;
            }
            return ts__error_prefix(st, "ts_replicate: replica %d on %s", i, devs[i]->name);
        }
    }
    return TS_OK;
}

/* ---- scatter and gather ------------------------------------------------------------------------- */
ts_status ts_scatter(const ts_tensor *x, ts_device *const *devs, int n, ts_tensor **chunks, int *count) {
    TS_ARG(x && chunks && count, "ts_scatter: NULL argument");
    TS_TRY(check_devices("ts_scatter", devs, n));
    *count = 0;
    for (int i = 0; i < n; i++) chunks[i] = NULL;
    if (x->ndim == 0) return ts_error(TS_ERR_SHAPE, "ts_scatter: cannot split a 0-dimensional tensor along dim 0");
    int64_t sizes[DP_MAX_DEVICES];
    int m = ts_chunk_sizes(x->shape[0], n, sizes);
    int64_t off = 0;
    for (int i = 0; i < m; i++) {
        ts_tensor *s = NULL;
        ts_status st = ts_slice(x, 0, off, off + sizes[i], &s);
        if (st == TS_OK) st = ts_to_device(s, devs[i], &chunks[i]);
        ts_tensor_release(s);
        if (st != TS_OK) {
            for (int k = 0; k <= i; k++) {
                ts_tensor_release(chunks[k]);
                chunks[k] = NULL;
            }
            return ts__error_prefix(st, "ts_scatter: chunk %d to %s", i, devs[i]->name);
        }
        off += sizes[i];
    }
    *count = m;
    return TS_OK;
}

ts_status ts_gather(ts_tensor *const *xs, int n, ts_device *dev, ts_tensor **out) {
    TS_ARG(xs && dev && out, "ts_gather: NULL argument");
    TS_ARG(n >= 1, "ts_gather: need at least one tensor, got %d", n);
    *out = NULL;
    int scalars = 0;
    for (int i = 0; i < n; i++) {
        TS_ARG(xs[i], "ts_gather: tensor %d is NULL", i);
        scalars += xs[i]->ndim == 0;
    }
    if (scalars > 0 && scalars < n)
        return ts_error(TS_ERR_SHAPE, "ts_gather: %d of the %d tensors are 0-dimensional, the others are not", scalars,
                        n);
    if (scalars == n)
        ts_log(TS_LOG_WARN, "ts_gather: asked to gather along dimension 0, but all input tensors were scalars; will "
                            "instead unsqueeze and return a vector");
    ts_tensor **moved = ts__calloc((size_t)n, sizeof *moved);
    if (!moved) return TS_ERR_NOMEM;
    ts_status st = TS_OK;
    for (int i = 0; i < n && st == TS_OK; i++) {
        ts_tensor *v = NULL;
        if (scalars) {
            int64_t one = 1;
            st = ts_reshape(xs[i], 1, &one, &v);
        } else {
            v = ts_tensor_retain(xs[i]);
        }
        if (st == TS_OK) st = ts_to_device(v, dev, &moved[i]);
        ts_tensor_release(v);
        if (st != TS_OK) ts__error_prefix(st, "ts_gather: tensor %d to %s", i, dev->name);
    }
    if (st == TS_OK) {
        st = ts_concat(moved, n, 0, out);
        if (st != TS_OK) ts__error_prefix(st, "ts_gather");
    }
    for (int i = 0; i < n; i++) ts_tensor_release(moved[i]);
    free(moved);
    return st;
}

/* ---- parallel_apply ------------------------------------------------------------------------------- */
typedef struct apply_task {
    ts_module *m;
    const ts_tensor *x;
    ts_tensor *out;
    int index;
    bool grad;
} apply_task;

static ts_status apply_run(void *p) {
    apply_task *t = p;
    bool prev = ts_grad_set_enabled(t->grad);
    ts_status st = ts_module_forward(t->m, t->x, &t->out);
    ts_grad_set_enabled(prev);
    if (st != TS_OK) return ts__error_prefix(st, "replica %d", t->index);
    return TS_OK;
}

/* Runs tasks[i] on devs[i]: all at once, or one after another when serial. */
static ts_status run_on_devices(ts_device *const *devs, int n, ts_task_fn fn, void *const *args, bool serial) {
    if (!serial) return ts_device_run_parallel(devs, n, fn, args);
    for (int i = 0; i < n; i++) TS_TRY(ts_device_run_parallel(&devs[i], 1, fn, &args[i]));
    return TS_OK;
}

ts_status ts_parallel_apply(ts_module *const *modules, ts_tensor *const *inputs, ts_device *const *devs, int n,
                            ts_tensor **outputs) {
    TS_ARG(modules && inputs && outputs, "ts_parallel_apply: NULL argument");
    TS_ARG(n >= 1 && n <= DP_MAX_DEVICES, "ts_parallel_apply: %d replicas (want 1 to %d)", n, DP_MAX_DEVICES);
    ts_device *dv[DP_MAX_DEVICES];
    apply_task tasks[DP_MAX_DEVICES];
    void *args[DP_MAX_DEVICES];
    bool serial = false;
    for (int i = 0; i < n; i++) {
        outputs[i] = NULL;
        TS_ARG(modules[i] && inputs[i], "ts_parallel_apply: module or input %d is NULL", i);
        dv[i] = devs ? devs[i] : inputs[i]->storage->device;
        TS_ARG(dv[i], "ts_parallel_apply: device %d is NULL", i);
        if (inputs[i]->storage->device != dv[i])
            return ts_error(TS_ERR_DEVICE, "ts_parallel_apply: input %d is on %s, not on its replica's device %s", i,
                            inputs[i]->storage->device->name, dv[i]->name);
        serial |= has_training_dropout(modules[i]);
        tasks[i] = (apply_task){modules[i], inputs[i], NULL, i, ts_grad_is_enabled()};
        args[i] = &tasks[i];
    }
    TS_TRY(check_devices("ts_parallel_apply", dv, n));
    ts_status st = run_on_devices(dv, n, apply_run, args, serial);
    for (int i = 0; i < n; i++) {
        if (st == TS_OK)
            outputs[i] = tasks[i].out;
        else
            ts_tensor_release(tasks[i].out);
    }
    return st;
}

/* ---- data_parallel: one node, parallel forward and backward ---------------------------------------- */
typedef struct dp_replica {
    struct dp_ctx *c;
    int index;
    ts_device *dev;
    ts_module *m;          /* replica (REP_LEAVES) */
    ts_tensor_list params; /* its parameters, in the source's order (live leaves) */
    int64_t start, len;    /* its rows of x */
    ts_tensor *x;          /* its input chunk (a leaf on dev) */
    ts_tensor *out;        /* its output: the root of its graph */
    int64_t out_start, out_rows; /* its rows of the gathered output */
    bool out_scalar;       /* a 0-dimensional output gathered as one row */
    ts_status st;
} dp_replica;

typedef struct dp_ctx {
    int m;                     /* replicas */
    bool trace;                /* the caller records a timeline: the replicas' tasks add their events to it */
    dp_replica r[DP_MAX_DEVICES];
    const ts_tensor *x;        /* forward only: the input (borrowed) */
    const ts_tensor_list *src; /* forward only: the module's parameters (borrowed) */
    ts_tensor *gout;           /* backward only: the output gradient (borrowed) */
    bool grad;                 /* forward: the caller's grad mode */
    bool retain;               /* backward: the outer pass's retain_graph */
} dp_ctx;

static void dp_ctx_free(void *p) {
    dp_ctx *c = p;
    if (!c) return;
    for (int i = 0; i < c->m; i++) {
        dp_replica *r = &c->r[i];
        ts_tensor_release(r->out);
        ts_tensor_release(r->x);
        ts_tensor_list_clear(&r->params);
        ts_module_free(r->m);
    }
    free(c);
}

/* Forward of one replica, on its device's worker. */
static ts_status dp_forward_task(void *p) {
    dp_replica *r = p;
    dp_ctx *c = r->c;
    double t0 = c->trace ? ts_time_now() : 0.0;
    bool prev = ts_grad_set_enabled(false);
    ts_status st = TS_OK;
    /* parameters that live elsewhere: fill the replica's leaves */
    for (int j = 0; j < c->src->n && st == TS_OK; j++)
        if (r->params.tensors[j]->storage->device != c->src->tensors[j]->storage->device)
            st = ts_tensor_copy_(r->params.tensors[j], c->src->tensors[j]);
    if (st == TS_OK) st = rows_to(c->x, r->start, r->len, r->dev, &r->x);
    ts_grad_set_enabled(c->grad);
    if (st == TS_OK) {
        ts_tensor_set_requires_grad(r->x, c->grad && c->x->requires_grad);
        st = ts_module_forward(r->m, r->x, &r->out);
    }
    ts_grad_set_enabled(prev);
    if (c->trace) ts__tl_event(TS__TL_DEVICE + r->index, "forward", t0, ts_time_now(), "replica", r->index, NULL, 0);
    if (st != TS_OK) return ts__error_prefix(st, "replica %d", r->index);
    return TS_OK;
}

/* Backward of one replica, on its device's worker. */
static ts_status dp_backward_task(void *p) {
    dp_replica *r = p;
    dp_ctx *c = r->c;
    if (!r->out->requires_grad) return TS_OK; /* nothing of this replica needs a gradient */
    double t0 = c->trace ? ts_time_now() : 0.0;
    ts_tensor *g = NULL, *gs = NULL;
    ts_status st = rows_to(c->gout, r->out_start, r->out_rows, r->dev, &g);
    if (st == TS_OK && r->out_scalar) {
        st = ts__view(g, 0, NULL, &gs);
        ts_tensor_release(g);
        g = gs;
    }
    if (st == TS_OK) st = ts_backward(r->out, g, c->retain);
    ts_tensor_release(g);
    if (c->trace) ts__tl_event(TS__TL_DEVICE + r->index, "backward", t0, ts_time_now(), "replica", r->index, NULL, 0);
    if (st != TS_OK) return ts__error_prefix(st, "replica %d backward", r->index);
    return TS_OK;
}

static ts_status dp_backward(ts_node *n, ts_tensor *gout_in, ts_tensor **gin) {
    dp_ctx *c = n->ctx;
    ts_device *xdev = (ts_device *)(uintptr_t)n->p.i[0];
    ts_tensor *gout = NULL;
    TS_TRY(ts__contiguous(gout_in, &gout));
    c->gout = gout;
    c->retain = ts__backward_retain_graph();
    ts_device *devs[DP_MAX_DEVICES];
    void *args[DP_MAX_DEVICES];
    for (int i = 0; i < c->m; i++) {
        devs[i] = c->r[i].dev;
        args[i] = &c->r[i];
    }
    ts_status st = ts_device_run_parallel(devs, c->m, dp_backward_task, args);
    c->gout = NULL;
    ts_tensor_release(gout);
    if (st != TS_OK) return ts__error_prefix(st, "DataParallel");

    /* parameters: sum over replicas, on the parameter's device */
    int np = n->ninputs - 1;
    for (int j = 0; j < np && st == TS_OK; j++) {
        if (!n->needs[1 + j]) continue;
        ts_device *pd = c->r[0].dev; /* devs[0], where the module's parameters are */
        ts_tensor *sum = NULL;
        for (int i = 0; i < c->m && st == TS_OK; i++) {
            ts_tensor *leaf = c->r[i].params.tensors[j], *g = leaf->grad;
            if (!g) continue;
            if (!sum) {
                if (g->storage->device == pd) { /* steal it: the leaf's grad is private (see ts__grad_accumulate) */
                    sum = ts_tensor_retain(g);
                    ts_tensor_zero_grad(leaf);
                } else {
                    st = plain_copy(g, pd, &sum);
                    ts_tensor_zero_grad(leaf);
                }
                continue;
            }
            ts_tensor *t = NULL;
            st = plain_copy(g, pd, &t);
            if (st == TS_OK) st = pd->k_ew->axpy(sum, 1.0f, t);
            ts_tensor_release(t);
            ts_tensor_zero_grad(leaf);
        }
        gin[1 + j] = sum;
    }
    /* the input: each chunk's gradient into its rows of x's gradient */
    if (st == TS_OK && n->needs[0]) {
        ts_tensor *gx = NULL;
        st = ts_tensor_zeros(xdev, TS_F32, n->in_ndim[0], n->in_shape[0], &gx);
        for (int i = 0; i < c->m && st == TS_OK; i++) {
            dp_replica *r = &c->r[i];
            ts_tensor *g = r->x ? r->x->grad : NULL, *v = NULL;
            if (!g || r->len == 0) continue;
            st = row_view(gx, r->start, r->len, &v);
            if (st == TS_OK) st = ts_tensor_copy_(v, g);
            ts_tensor_release(v);
            ts_tensor_zero_grad(r->x);
        }
        if (st == TS_OK)
            gin[0] = gx;
        else
            ts_tensor_release(gx);
    }
    return st;
}

/* n == 1: PyTorch runs the module itself on devs[0]. */
static ts_status dp_single(ts_module *module, const ts_tensor *x, ts_device *dev, ts_device *odev, ts_tensor **out) {
    ts_tensor *xd = NULL, *y = NULL;
    TS_TRY(ts_to_device(x, dev, &xd));
    ts_status st = ts_module_forward(module, xd, &y);
    ts_tensor_release(xd);
    if (st == TS_OK) st = ts_to_device(y, odev, out);
    ts_tensor_release(y);
    return st;
}

/* Gathers the replicas' outputs into one new tensor on odev (no autograd). */
static ts_status dp_gather_outputs(dp_ctx *c, ts_device *odev, ts_tensor **out) {
    const ts_tensor *ref = c->r[0].out;
    int scalars = 0;
    for (int i = 0; i < c->m; i++) scalars += c->r[i].out->ndim == 0;
    if (scalars && scalars != c->m)
        return ts_error(TS_ERR_SHAPE, "DataParallel: some replicas returned 0-dimensional outputs, others did not");
    int ndim = scalars ? 1 : ref->ndim;
    int64_t shape[TS_MAX_DIMS];
    if (scalars)
        shape[0] = 0;
    else
        memcpy(shape, ref->shape, sizeof(int64_t) * (size_t)ndim);
    int64_t total = 0;
    char a[96], b[96];
    for (int i = 0; i < c->m; i++) {
        dp_replica *r = &c->r[i];
        const ts_tensor *o = r->out;
        if (o->dtype != ref->dtype)
            return ts_error(TS_ERR_DTYPE, "DataParallel: replica %d returned %s, replica 0 %s", i,
                            ts_dtype_name(o->dtype), ts_dtype_name(ref->dtype));
        if (!scalars) {
            bool same = o->ndim == ref->ndim;
            for (int k = 1; same && k < ndim; k++) same = o->shape[k] == ref->shape[k];
            if (!same)
                return ts_error(TS_ERR_SHAPE,
                                "DataParallel: replica outputs must agree except in dim 0: replica %d returned %s, "
                                "replica 0 %s",
                                i, ts_shape_str(o->ndim, o->shape, a, sizeof a),
                                ts_shape_str(ref->ndim, ref->shape, b, sizeof b));
        }
        r->out_scalar = scalars > 0;
        r->out_start = total;
        r->out_rows = scalars ? 1 : o->shape[0];
        total += r->out_rows;
    }
    shape[0] = total;
    ts_tensor *y = NULL;
    TS_TRY(ts__new(odev, ref->dtype, ndim, shape, &y));
    ts_status st = TS_OK;
    for (int i = 0; i < c->m && st == TS_OK; i++) {
        dp_replica *r = &c->r[i];
        ts_tensor *v = NULL, *src = NULL;
        if (r->out_rows == 0) continue;
        st = row_view(y, r->out_start, r->out_rows, &v);
        if (st == TS_OK) st = r->out_scalar ? ts__view(r->out, 1, (int64_t[]){1}, &src) : ts_tensor_detach(r->out, &src);
        if (st == TS_OK) st = ts_tensor_copy_(v, src);
        ts_tensor_release(v);
        ts_tensor_release(src);
    }
    if (st != TS_OK) {
        ts_tensor_release(y);
        return st;
    }
    *out = y;
    return TS_OK;
}

ts_status ts_data_parallel(ts_module *module, const ts_tensor *x, ts_device *const *devs, int n,
                           ts_device *output_device, ts_tensor **out) {
    TS_ARG(module && x && out, "ts_data_parallel: NULL argument");
    *out = NULL;
    TS_TRY(check_devices("ts_data_parallel", devs, n));
    TS_TRY(check_module_on("ts_data_parallel", module, devs[0]));
    ts_device *odev = output_device ? output_device : devs[0];
    if (x->ndim == 0) return ts_error(TS_ERR_SHAPE, "ts_data_parallel: the input is 0-dimensional (no batch dim)");
    if (n == 1) return dp_single(module, x, devs[0], odev, out);

    ts_status st = TS_OK;
    ts_tensor_list src = TS_TENSOR_LIST_INIT;
    ts_tensor *y = NULL;
    dp_ctx *c = ts__calloc(1, sizeof *c);
    if (!c) return TS_ERR_NOMEM;
    TS_CHECK_GOTO(ts_module_parameters(module, &src));
    int64_t sizes[DP_MAX_DEVICES];
    c->m = ts_chunk_sizes(x->shape[0], n, sizes);
    c->x = x;
    c->src = &src;
    c->grad = ts_grad_is_enabled();
    c->trace = ts__tl_on(); /* the backward tasks (run from the caller's backward) record for it too */
    for (int i = 0; i < c->m && c->trace; i++) {
        char lane[96];
        snprintf(lane, sizeof lane, "DataParallel replica %d (%s)", i, devs[i]->name);
        ts__tl_lane(TS__TL_DEVICE + i, lane);
    }
    ts_device *used[DP_MAX_DEVICES];
    void *args[DP_MAX_DEVICES];
    int64_t off = 0;
    for (int i = 0; i < c->m; i++) {
        dp_replica *r = &c->r[i];
        r->c = c;
        r->index = i;
        r->dev = used[i] = devs[i];
        r->start = off;
        r->len = sizes[i];
        off += sizes[i];
        args[i] = r;
        /* buffers are copied here, before any replica runs: devs[0]'s replica
         * updates the module's own running statistics in place */
        st = replicate_tree(module, devs[i], REP_LEAVES, &r->m);
        if (st == TS_OK) st = ts_module_parameters(r->m, &r->params);
        if (st != TS_OK) {
            ts__error_prefix(st, "ts_data_parallel: replica %d on %s", i, devs[i]->name);
            goto fail;
        }
    }
    st = run_on_devices(used, c->m, dp_forward_task, args, has_training_dropout(module));
    if (st != TS_OK) {
        ts__error_prefix(st, "DataParallel");
        goto fail;
    }
    TS_CHECK_GOTO(dp_gather_outputs(c, odev, &y));
    c->x = NULL;
    c->src = NULL;

    /* one node: x and every parameter */
    int np = src.n;
    const ts_tensor **in = ts__calloc((size_t)np + 1, sizeof *in);
    if (!in) {
        st = TS_ERR_NOMEM;
        goto fail;
    }
    in[0] = x;
    for (int j = 0; j < np; j++) in[1 + j] = src.tensors[j];
    ts_node *node = NULL;
    st = ts__node_new("DataParallel", dp_backward, np + 1, in, &node);
    free(in);
    if (st != TS_OK) goto fail;
    if (node) {
        node->p.i[0] = (int64_t)(uintptr_t)x->storage->device;
        node->ctx = c;
        node->free_ctx = dp_ctx_free;
        ts__node_attach(node, y);
    } else {
        dp_ctx_free(c); /* nothing to differentiate: the replicas go now */
    }
    ts_tensor_list_clear(&src);
    *out = y;
    return TS_OK;
fail:
    ts_tensor_release(y);
    dp_ctx_free(c);
    ts_tensor_list_clear(&src);
    return st;
}

/* ---- the DataParallel module ------------------------------------------------------------------------ */
typedef struct dp_module {
    int n;
    ts_device *devs[DP_MAX_DEVICES];
    ts_device *output_device;
} dp_module;

static ts_status dp_module_forward(ts_module *m, const ts_tensor *x, ts_tensor **out) {
    const dp_module *c = m->impl;
    return ts_data_parallel(m->children[0], x, c->devs, c->n, c->output_device, out);
}
static const ts_module_vt dp_module_vt = {
    .name = "DataParallel", .kind = TS_MODULE_DATA_PARALLEL, .forward = dp_module_forward};

ts_status ts_nn_data_parallel_new(ts_module *module, ts_device *const *devs, int n, ts_device *output_device,
                                  ts_module **out) {
    ts_status st;
    ts_module *m = NULL;
    if (!module || !out) {
        ts_module_free(module);
        return ts_error(TS_ERR_INVALID_ARG, "ts_nn_data_parallel_new: NULL argument");
    }
    *out = NULL;
    TS_CHECK_GOTO(check_devices("ts_nn_data_parallel_new", devs, n));
    TS_CHECK_GOTO(ts_module_to(module, devs[0])); /* PyTorch: the module lives on device_ids[0] */
    TS_CHECK_GOTO(ts__module_new(&dp_module_vt, sizeof(dp_module), &m));
    dp_module *c = m->impl;
    c->n = n;
    memcpy(c->devs, devs, sizeof *devs * (size_t)n);
    c->output_device = output_device ? output_device : devs[0];
    m->training = module->training;
    st = ts__module_add_child(m, "module", module);
    module = NULL; /* owned by m, or freed */
    TS_CHECK_GOTO(st);
    *out = m;
    return TS_OK;
fail:
    ts_module_free(module);
    ts_module_free(m);
    return st;
}
