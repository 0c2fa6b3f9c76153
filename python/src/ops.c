/*
 * python/src/ops.c — the ops of tessera/ops.h from Python, with autograd: tessera.ops.add(a, b), ...,
 * tessera.Tensor's operators (+, -, *, /, @, unary -), requires_grad, .grad, .backward(), detach, clone, item,
 * grad mode (tessera.no_grad), and new tensors (tessera.tensor, randn, full). Ops of one or two tensors come
 * from two tables (UNARY_OPS, BINARY_OPS) through one wrapper each; the others parse their options here.
 * Inputs may be tessera.Tensors or anything with __dlpack__ (torch tensors, NumPy arrays: shared, not
 * copied); binary ops and operators also take Python numbers (a 0-d float32 tensor, broadcast). The library
 * checks dtypes, shapes and devices: its errors come back as tessera.ShapeError, DtypeError, ... with its
 * message. Ops run with the GIL held (they are short, and a model's forward in Python calls them one after
 * the other); backward releases it.
 */
#include "tspy.h"

#include <string.h>

/* ---- arguments ------------------------------------------------------------------------------------------ */

/* o as a tensor (a new reference in *out): a tessera.Tensor, a Python number (a 0-d float32 tensor on like's
 * device, the CPU without like), or a DLPack producer. -1 with an exception set. */
static int as_tensor(PyObject *o, const ts_tensor *like, ts_tensor **out) {
    ts_tensor *t = tspy_tensor_get(o);
    if (t) {
        *out = ts_tensor_retain(t);
        return 0;
    }
    if (PyFloat_Check(o) || PyLong_Check(o)) {
        double v = PyFloat_AsDouble(o);
        if (v == -1.0 && PyErr_Occurred()) return -1;
        ts_status st = ts_tensor_full(like ? ts_tensor_device(like) : ts_device_cpu(), 0, NULL, (float)v, out);
        if (st != TS_OK) {
            tspy_raise(st);
            return -1;
        }
        return 0;
    }
    return tspy_tensor_from_object(o, out);
}

/* An optional tensor argument (None: NULL). */
static int as_tensor_opt(PyObject *o, ts_tensor **out) {
    *out = NULL;
    return o == NULL || o == Py_None ? 0 : as_tensor(o, NULL, out);
}

/* The result of a library call: the tensor wrapped, or the library's error raised. */
static PyObject *result(ts_status st, ts_tensor *out) {
    if (st != TS_OK) {
        ts_tensor_release(out);
        return tspy_raise(st);
    }
    return tspy_tensor_wrap(out);
}

/* An int or a pair of ints (kernel sizes, strides, ...) into v[2]. */
static int int_pair(PyObject *o, const char *what, int v[2]) {
    if (PyLong_Check(o)) {
        v[0] = v[1] = (int)PyLong_AsLong(o);
        return PyErr_Occurred() ? -1 : 0;
    }
    PyObject *seq = PySequence_Check(o) ? PySequence_Tuple(o) : NULL;
    if (!seq || PyTuple_Size(seq) != 2) {
        Py_XDECREF(seq);
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "%s: expected an int or a pair of ints", what);
        return -1;
    }
    for (int i = 0; i < 2; i++) v[i] = (int)PyLong_AsLong(PyTuple_GetItem(seq, i));
    Py_DECREF(seq);
    return PyErr_Occurred() ? -1 : 0;
}

/* ---- ops of one tensor and of two: the tables ------------------------------------------------------------ */

static PyObject *run_unary(ts_status (*fn)(const ts_tensor *, ts_tensor **), PyObject *x) {
    ts_tensor *a, *out = NULL;
    if (as_tensor(x, NULL, &a) < 0) return NULL;
    ts_status st = fn(a, &out);
    ts_tensor_release(a);
    return result(st, out);
}

static PyObject *run_binary(ts_status (*fn)(const ts_tensor *, const ts_tensor *, ts_tensor **), PyObject *x,
                            PyObject *y) {
    ts_tensor *a = NULL, *b = NULL, *out = NULL;
    const ts_tensor *like = tspy_tensor_get(x) ? tspy_tensor_get(x) : tspy_tensor_get(y);
    if (as_tensor(x, like, &a) < 0 || as_tensor(y, like ? like : a, &b) < 0) {
        ts_tensor_release(a);
        return NULL;
    }
    ts_status st = fn(a, b, &out);
    ts_tensor_release(a);
    ts_tensor_release(b);
    return result(st, out);
}

/* X(python name, library function, doc) */
#define UNARY_OPS(X)                                                                                             \
    X(relu, ts_relu, "relu(x) -> max(x, 0)")                                                                     \
    X(sigmoid, ts_sigmoid, "sigmoid(x)")                                                                         \
    X(tanh, ts_tanh, "tanh(x)")                                                                                  \
    X(silu, ts_silu, "silu(x) -> x * sigmoid(x)")                                                                \
    X(global_avg_pool2d, ts_global_avgpool2d, "global_avg_pool2d(x) -> (N, C, 1, 1): adaptive_avg_pool2d(x, 1)")
#define BINARY_OPS(X)                                                                                            \
    X(add, ts_add, "add(a, b) -> a + b (broadcasting)")                                                          \
    X(sub, ts_sub, "sub(a, b) -> a - b (broadcasting)")                                                          \
    X(mul, ts_mul, "mul(a, b) -> a * b (broadcasting)")                                                          \
    X(div, ts_div, "div(a, b) -> a / b (broadcasting)")                                                          \
    X(matmul, ts_matmul, "matmul(a, b): torch.matmul (batch dims broadcast, 1-D operands are vectors)")           \
    X(bmm, ts_bmm, "bmm(a, b): (B, M, K) x (B, K, N) -> (B, M, N)")                                              \
    X(mse_loss, ts_mse_loss, "mse_loss(input, target) -> the mean squared error, shape ()")                      \
    X(embedding, ts_embedding, "embedding(input, weight): int64 indices of any shape -> shape + (dim,)")

#define DEF_UNARY(name, fn, doc)                                                                                 \
    static PyObject *py_##name(PyObject *m, PyObject *x) {                                                      \
        (void)m;                                                                                                 \
        return run_unary(fn, x);                                                                                 \
    }
#define DEF_BINARY(name, fn, doc)                                                                                \
    static PyObject *py_##name(PyObject *m, PyObject *const *args, Py_ssize_t n) {                              \
        (void)m;                                                                                                 \
        if (n != 2) return PyErr_Format(PyExc_TypeError, #name "() takes 2 arguments (%zd given)", n);          \
        return run_binary(fn, args[0], args[1]);                                                                 \
    }
UNARY_OPS(DEF_UNARY)
BINARY_OPS(DEF_BINARY)

/* ---- ops with options ------------------------------------------------------------------------------------- */


/* A tensor and up to three optional ones (weight, bias, ...), released together. */
typedef struct targs {
    ts_tensor *t[4];
} targs;

static void targs_clear(targs *a) {
    for (int i = 0; i < 4; i++) ts_tensor_release(a->t[i]);
}

/* objs[0] required, the others optional (None). -1 with an exception set (nothing left). */
static int targs_get(targs *a, PyObject *o0, PyObject *o1, PyObject *o2, PyObject *o3) {
    memset(a, 0, sizeof *a);
    PyObject *o[4] = {o0, o1, o2, o3};
    if (as_tensor(o[0], NULL, &a->t[0]) < 0) return -1;
    for (int i = 1; i < 4; i++)
        if (as_tensor_opt(o[i], &a->t[i]) < 0) {
            targs_clear(a);
            return -1;
        }
    return 0;
}

static PyObject *py_scale(PyObject *m, PyObject *args) {
    (void)m;
    PyObject *x;
    float s;
    if (!PyArg_ParseTuple(args, "Of:scale", &x, &s)) return NULL;
    targs a;
    if (targs_get(&a, x, NULL, NULL, NULL) < 0) return NULL;
    ts_tensor *out = NULL;
    ts_status st = ts_scale(a.t[0], s, &out);
    targs_clear(&a);
    return result(st, out);
}

static PyObject *py_gelu(PyObject *m, PyObject *args, PyObject *kw) {
    (void)m;
    static char *names[] = {"x", "approximate", NULL};
    PyObject *x;
    const char *approx = "none";
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|s:gelu", names, &x, &approx)) return NULL;
    bool tanh_approx = strcmp(approx, "tanh") == 0;
    if (!tanh_approx && strcmp(approx, "none") != 0)
        return PyErr_Format(tspy_error_class(TS_ERR_INVALID_ARG), "gelu: approximate '%s' (expected 'none' or "
                            "'tanh')", approx);
    targs a;
    if (targs_get(&a, x, NULL, NULL, NULL) < 0) return NULL;
    ts_tensor *out = NULL;
    ts_status st = ts_gelu(a.t[0], tanh_approx, &out);
    targs_clear(&a);
    return result(st, out);
}

/* softmax(x, dim), log_softmax(x, dim), flatten's and transpose's ints: one tensor and ints. */
static PyObject *tensor_dim_op(PyObject *args, PyObject *kw, const char *fmt, char **names,
                               ts_status (*fn)(const ts_tensor *, int, ts_tensor **)) {
    PyObject *x;
    int dim = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, fmt, names, &x, &dim)) return NULL;
    targs a;
    if (targs_get(&a, x, NULL, NULL, NULL) < 0) return NULL;
    ts_tensor *out = NULL;
    ts_status st = fn(a.t[0], dim, &out);
    targs_clear(&a);
    return result(st, out);
}

static PyObject *py_softmax(PyObject *m, PyObject *args, PyObject *kw) {
    (void)m;
    static char *names[] = {"x", "dim", NULL};
    return tensor_dim_op(args, kw, "Oi:softmax", names, ts_softmax);
}

static PyObject *py_log_softmax(PyObject *m, PyObject *args, PyObject *kw) {
    (void)m;
    static char *names[] = {"x", "dim", NULL};
    return tensor_dim_op(args, kw, "Oi:log_softmax", names, ts_log_softmax);
}

/* sum(x, dim=None, keepdim=False), mean(...) */
static PyObject *reduce_op(PyObject *args, PyObject *kw, const char *fmt, ts_status (*all)(const ts_tensor *, ts_tensor **),
                           ts_status (*dims_fn)(const ts_tensor *, int, const int *, bool, ts_tensor **)) {
    static char *names[] = {"x", "dim", "keepdim", NULL};
    PyObject *x, *dim = Py_None;
    int keepdim = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, fmt, names, &x, &dim, &keepdim)) return NULL;
    int64_t d64[TS_MAX_DIMS];
    int nd = 0, dims[TS_MAX_DIMS];
    if (dim != Py_None && tspy_int64_list(dim, "dim", d64, &nd) < 0) return NULL;
    for (int i = 0; i < nd; i++) dims[i] = (int)d64[i];
    targs a;
    if (targs_get(&a, x, NULL, NULL, NULL) < 0) return NULL;
    ts_tensor *out = NULL;
    ts_status st = dim == Py_None && !keepdim ? all(a.t[0], &out) : dims_fn(a.t[0], nd, dims, keepdim, &out);
    targs_clear(&a);
    return result(st, out);
}

static PyObject *py_sum(PyObject *m, PyObject *args, PyObject *kw) {
    (void)m;
    return reduce_op(args, kw, "O|Op:sum", ts_sum, ts_sum_dims);
}

static PyObject *py_mean(PyObject *m, PyObject *args, PyObject *kw) {
    (void)m;
    return reduce_op(args, kw, "O|Op:mean", ts_mean, ts_mean_dims);
}

/* max(x, dim, keepdim=False) -> (values, indices) */
static PyObject *py_max(PyObject *m, PyObject *args, PyObject *kw) {
    (void)m;
    static char *names[] = {"x", "dim", "keepdim", NULL};
    PyObject *x;
    int dim, keepdim = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "Oi|p:max", names, &x, &dim, &keepdim)) return NULL;
    targs a;
    if (targs_get(&a, x, NULL, NULL, NULL) < 0) return NULL;
    ts_tensor *v = NULL, *i = NULL;
    ts_status st = ts_max_dim(a.t[0], dim, keepdim, &v, &i);
    targs_clear(&a);
    if (st != TS_OK) {
        ts_tensor_release(v);
        ts_tensor_release(i);
        return tspy_raise(st);
    }
    PyObject *pv = tspy_tensor_wrap(v), *pi = pv ? tspy_tensor_wrap(i) : (ts_tensor_release(i), NULL);
    PyObject *r = pv && pi ? PyTuple_Pack(2, pv, pi) : NULL;
    Py_XDECREF(pv);
    Py_XDECREF(pi);
    return r;
}

static PyObject *py_linear(PyObject *m, PyObject *args, PyObject *kw) {
    (void)m;
    static char *names[] = {"x", "weight", "bias", NULL};
    PyObject *x, *w, *b = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO|O:linear", names, &x, &w, &b)) return NULL;
    targs a;
    if (targs_get(&a, x, w, b, NULL) < 0) return NULL;
    ts_tensor *out = NULL;
    ts_status st = a.t[1] ? ts_linear(a.t[0], a.t[1], a.t[2], &out)
                          : ts_error(TS_ERR_INVALID_ARG, "linear: weight is None");
    targs_clear(&a);
    return result(st, out);
}

/* conv2d(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1) */
static PyObject *py_conv2d(PyObject *m, PyObject *args, PyObject *kw) {
    (void)m;
    static char *names[] = {"x", "weight", "bias", "stride", "padding", "dilation", "groups", NULL};
    PyObject *x, *w, *b = Py_None, *stride = NULL, *padding = NULL, *dilation = NULL;
    ts_conv2d_params p = TS_CONV2D_DEFAULT;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO|OOOOi:conv2d", names, &x, &w, &b, &stride, &padding, &dilation,
                                     &p.groups))
        return NULL;
    if ((stride && int_pair(stride, "conv2d: stride", p.stride) < 0) ||
        (padding && int_pair(padding, "conv2d: padding", p.padding) < 0) ||
        (dilation && int_pair(dilation, "conv2d: dilation", p.dilation) < 0))
        return NULL;
    targs a;
    if (targs_get(&a, x, w, b, NULL) < 0) return NULL;
    ts_tensor *out = NULL;
    ts_status st = a.t[1] ? ts_conv2d(a.t[0], a.t[1], a.t[2], p, &out)
                          : ts_error(TS_ERR_INVALID_ARG, "conv2d: weight is None");
    targs_clear(&a);
    return result(st, out);
}

/* The pooling parameters of max_pool2d / avg_pool2d (stride None: the kernel). */
static int pool_params(PyObject *kernel, PyObject *stride, PyObject *padding, PyObject *dilation, const char *fn,
                       ts_pool2d_params *p) {
    memset(p, 0, sizeof *p);
    char what[64];
    snprintf(what, sizeof what, "%s: kernel_size", fn);
    if (int_pair(kernel, what, p->kernel) < 0) return -1;
    snprintf(what, sizeof what, "%s: stride", fn);
    if (stride && stride != Py_None && int_pair(stride, what, p->stride) < 0) return -1;
    snprintf(what, sizeof what, "%s: padding", fn);
    if (padding && int_pair(padding, what, p->padding) < 0) return -1;
    snprintf(what, sizeof what, "%s: dilation", fn);
    if (dilation && int_pair(dilation, what, p->dilation) < 0) return -1;
    return 0;
}

static PyObject *py_max_pool2d(PyObject *m, PyObject *args, PyObject *kw) {
    (void)m;
    static char *names[] = {"x", "kernel_size", "stride", "padding", "dilation", "ceil_mode", NULL};
    PyObject *x, *k, *s = Py_None, *pad = NULL, *dil = NULL;
    int ceil = 0;
    ts_pool2d_params p;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO|OOOp:max_pool2d", names, &x, &k, &s, &pad, &dil, &ceil) ||
        pool_params(k, s, pad, dil, "max_pool2d", &p) < 0)
        return NULL;
    p.ceil_mode = ceil;
    targs a;
    if (targs_get(&a, x, NULL, NULL, NULL) < 0) return NULL;
    ts_tensor *out = NULL;
    ts_status st = ts_maxpool2d(a.t[0], p, &out);
    targs_clear(&a);
    return result(st, out);
}

static PyObject *py_avg_pool2d(PyObject *m, PyObject *args, PyObject *kw) {
    (void)m;
    static char *names[] = {"x", "kernel_size", "stride", "padding", "ceil_mode", "count_include_pad", NULL};
    PyObject *x, *k, *s = Py_None, *pad = NULL;
    int ceil = 0, include = 1;
    ts_pool2d_params p;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO|OOpp:avg_pool2d", names, &x, &k, &s, &pad, &ceil, &include) ||
        pool_params(k, s, pad, NULL, "avg_pool2d", &p) < 0)
        return NULL;
    p.ceil_mode = ceil;
    p.exclude_pad = !include;
    targs a;
    if (targs_get(&a, x, NULL, NULL, NULL) < 0) return NULL;
    ts_tensor *out = NULL;
    ts_status st = ts_avgpool2d(a.t[0], p, &out);
    targs_clear(&a);
    return result(st, out);
}

static PyObject *py_adaptive_avg_pool2d(PyObject *m, PyObject *args, PyObject *kw) {
    (void)m;
    static char *names[] = {"x", "output_size", NULL};
    PyObject *x, *size;
    int hw[2];
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO:adaptive_avg_pool2d", names, &x, &size) ||
        int_pair(size, "adaptive_avg_pool2d: output_size", hw) < 0)
        return NULL;
    targs a;
    if (targs_get(&a, x, NULL, NULL, NULL) < 0) return NULL;
    ts_tensor *out = NULL;
    ts_status st = ts_adaptive_avgpool2d(a.t[0], hw[0], hw[1], &out);
    targs_clear(&a);
    return result(st, out);
}

/* batch_norm(x, running_mean, running_var, weight=None, bias=None, training=False, momentum=0.1, eps=1e-5):
 * torch.nn.functional.batch_norm; (N, C, H, W) inputs go to ts_batchnorm2d, (N, C) and (N, C, L) to 1d. */
static PyObject *py_batch_norm(PyObject *m, PyObject *args, PyObject *kw) {
    (void)m;
    static char *names[] = {"x", "running_mean", "running_var", "weight", "bias", "training", "momentum", "eps", NULL};
    PyObject *x, *rm = Py_None, *rv = Py_None, *w = Py_None, *b = Py_None;
    int training = 0;
    float momentum = 0.1f, eps = 1e-5f;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOO|OOpff:batch_norm", names, &x, &rm, &rv, &w, &b, &training,
                                     &momentum, &eps))
        return NULL;
    targs a, r;
    if (targs_get(&a, x, w, b, NULL) < 0) return NULL;
    if (targs_get(&r, x, rm, rv, NULL) < 0) {
        targs_clear(&a);
        return NULL;
    }
    ts_tensor *out = NULL;
    ts_status st = ts_tensor_ndim(a.t[0]) == 4
                       ? ts_batchnorm2d(a.t[0], a.t[1], a.t[2], r.t[1], r.t[2], training, momentum, eps, &out)
                       : ts_batchnorm1d(a.t[0], a.t[1], a.t[2], r.t[1], r.t[2], training, momentum, eps, &out);
    targs_clear(&a);
    targs_clear(&r);
    return result(st, out);
}

/* layer_norm(x, normalized_shape, weight=None, bias=None, eps=1e-5) */
static PyObject *py_layer_norm(PyObject *m, PyObject *args, PyObject *kw) {
    (void)m;
    static char *names[] = {"x", "normalized_shape", "weight", "bias", "eps", NULL};
    PyObject *x, *shape, *w = Py_None, *b = Py_None;
    float eps = 1e-5f;
    int64_t ns[TS_MAX_DIMS];
    int nn = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO|OOf:layer_norm", names, &x, &shape, &w, &b, &eps) ||
        tspy_int64_list(shape, "layer_norm: normalized_shape", ns, &nn) < 0)
        return NULL;
    targs a;
    if (targs_get(&a, x, w, b, NULL) < 0) return NULL;
    int nd = ts_tensor_ndim(a.t[0]);
    const int64_t *xs = ts_tensor_shape(a.t[0]);
    bool fits = nn >= 1 && nn <= nd;
    for (int i = 0; fits && i < nn; i++) fits = xs[nd - nn + i] == ns[i];
    ts_tensor *out = NULL;
    ts_status st;
    if (!fits) {
        char xb[128], nb[128];
        st = ts_error(TS_ERR_SHAPE, "layer_norm: normalized_shape %s does not match the last dims of x %s",
                      ts_shape_str(nn, ns, nb, sizeof nb), ts_shape_str(nd, xs, xb, sizeof xb));
    } else {
        st = ts_layer_norm(a.t[0], nn, a.t[1], a.t[2], eps, &out);
    }
    targs_clear(&a);
    return result(st, out);
}

static PyObject *py_group_norm(PyObject *m, PyObject *args, PyObject *kw) {
    (void)m;
    static char *names[] = {"x", "num_groups", "weight", "bias", "eps", NULL};
    PyObject *x, *w = Py_None, *b = Py_None;
    int groups;
    float eps = 1e-5f;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "Oi|OOf:group_norm", names, &x, &groups, &w, &b, &eps)) return NULL;
    targs a;
    if (targs_get(&a, x, w, b, NULL) < 0) return NULL;
    ts_tensor *out = NULL;
    ts_status st = ts_group_norm(a.t[0], groups, a.t[1], a.t[2], eps, &out);
    targs_clear(&a);
    return result(st, out);
}

static PyObject *py_reshape(PyObject *m, PyObject *args, PyObject *kw) {
    (void)m;
    static char *names[] = {"x", "shape", NULL};
    PyObject *x, *shape;
    int64_t s[TS_MAX_DIMS];
    int n = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO:reshape", names, &x, &shape) ||
        tspy_int64_list(shape, "reshape: shape", s, &n) < 0)
        return NULL;
    targs a;
    if (targs_get(&a, x, NULL, NULL, NULL) < 0) return NULL;
    ts_tensor *out = NULL;
    ts_status st = ts_reshape(a.t[0], n, s, &out);
    targs_clear(&a);
    return result(st, out);
}

/* flatten(x, start_dim=0, end_dim=-1): torch.flatten */
static PyObject *py_flatten(PyObject *m, PyObject *args, PyObject *kw) {
    (void)m;
    static char *names[] = {"x", "start_dim", "end_dim", NULL};
    PyObject *x;
    int start = 0, end = -1;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|ii:flatten", names, &x, &start, &end)) return NULL;
    targs a;
    if (targs_get(&a, x, NULL, NULL, NULL) < 0) return NULL;
    ts_tensor *out = NULL;
    ts_status st = ts_flatten_range(a.t[0], start, end, &out);
    targs_clear(&a);
    return result(st, out);
}

static PyObject *py_transpose(PyObject *m, PyObject *args, PyObject *kw) {
    (void)m;
    static char *names[] = {"x", "dim0", "dim1", NULL};
    PyObject *x;
    int d0, d1;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "Oii:transpose", names, &x, &d0, &d1)) return NULL;
    targs a;
    if (targs_get(&a, x, NULL, NULL, NULL) < 0) return NULL;
    ts_tensor *out = NULL;
    ts_status st = ts_transpose(a.t[0], d0, d1, &out);
    targs_clear(&a);
    return result(st, out);
}

static PyObject *py_permute(PyObject *m, PyObject *args, PyObject *kw) {
    (void)m;
    static char *names[] = {"x", "dims", NULL};
    PyObject *x, *dims;
    int64_t d[TS_MAX_DIMS];
    int n = 0, perm[TS_MAX_DIMS];
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO:permute", names, &x, &dims) ||
        tspy_int64_list(dims, "permute: dims", d, &n) < 0)
        return NULL;
    targs a;
    if (targs_get(&a, x, NULL, NULL, NULL) < 0) return NULL;
    for (int i = 0; i < n; i++) perm[i] = (int)d[i];
    ts_tensor *out = NULL;
    char sb[128];
    ts_status st = n == ts_tensor_ndim(a.t[0])
                       ? ts_permute(a.t[0], perm, &out)
                       : ts_error(TS_ERR_SHAPE, "permute: %d dims for a tensor of shape %s", n,
                                  ts_shape_str(ts_tensor_ndim(a.t[0]), ts_tensor_shape(a.t[0]), sb, sizeof sb));
    targs_clear(&a);
    return result(st, out);
}

/* narrow(x, dim, start, length): torch.narrow, elements [start, start + length) along dim */
static PyObject *py_narrow(PyObject *m, PyObject *args, PyObject *kw) {
    (void)m;
    static char *names[] = {"x", "dim", "start", "length", NULL};
    PyObject *x;
    int dim;
    long long start, length;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OiLL:narrow", names, &x, &dim, &start, &length)) return NULL;
    targs a;
    if (targs_get(&a, x, NULL, NULL, NULL) < 0) return NULL;
    ts_tensor *out = NULL;
    ts_status st = ts_slice(a.t[0], dim, start, start + length, &out);
    targs_clear(&a);
    return result(st, out);
}

/* cat(tensors, dim=0) */
static PyObject *py_cat(PyObject *m, PyObject *args, PyObject *kw) {
    (void)m;
    static char *names[] = {"tensors", "dim", NULL};
    PyObject *seq;
    int dim = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|i:cat", names, &seq, &dim)) return NULL;
    PyObject *tup = PySequence_Check(seq) ? PySequence_Tuple(seq) : NULL;
    if (!tup) {
        PyErr_Clear();
        return PyErr_Format(PyExc_TypeError, "cat: expected a sequence of tensors");
    }
    Py_ssize_t n = PyTuple_Size(tup);
    ts_tensor **ts = PyMem_Calloc(n ? (size_t)n : 1, sizeof *ts);
    ts_status st = TS_OK;
    int failed = ts == NULL;
    for (Py_ssize_t i = 0; !failed && i < n; i++) failed = as_tensor(PyTuple_GetItem(tup, i), NULL, &ts[i]) < 0;
    ts_tensor *out = NULL;
    if (!failed) st = ts_concat(ts, (int)n, dim, &out);
    for (Py_ssize_t i = 0; ts && i < n; i++) ts_tensor_release(ts[i]);
    PyMem_Free(ts);
    Py_DECREF(tup);
    if (failed) return PyErr_Occurred() ? NULL : PyErr_NoMemory();
    return result(st, out);
}

static PyObject *py_dropout(PyObject *m, PyObject *args, PyObject *kw) {
    (void)m;
    static char *names[] = {"x", "p", "training", NULL};
    PyObject *x;
    float p = 0.5f;
    int training = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|fp:dropout", names, &x, &p, &training)) return NULL;
    targs a;
    if (targs_get(&a, x, NULL, NULL, NULL) < 0) return NULL;
    ts_tensor *out = NULL;
    ts_status st = ts_dropout(a.t[0], p, training, NULL, &out);
    targs_clear(&a);
    return result(st, out);
}

/* cross_entropy(input, target, weight=None, ignore_index=-100, reduction='mean', label_smoothing=0.0) */
static PyObject *py_cross_entropy(PyObject *m, PyObject *args, PyObject *kw) {
    (void)m;
    static char *names[] = {"input", "target", "weight", "ignore_index", "reduction", "label_smoothing", NULL};
    PyObject *x, *y, *w = Py_None;
    long long ignore = -100;
    const char *red = "mean";
    float ls = 0.0f;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO|OLsf:cross_entropy", names, &x, &y, &w, &ignore, &red, &ls))
        return NULL;
    ts_cross_entropy_opts o = TS_CROSS_ENTROPY_OPTS_INIT;
    if (strcmp(red, "mean") == 0) o.reduction = TS_REDUCTION_MEAN;
    else if (strcmp(red, "sum") == 0) o.reduction = TS_REDUCTION_SUM;
    else if (strcmp(red, "none") == 0) o.reduction = TS_REDUCTION_NONE;
    else
        return PyErr_Format(tspy_error_class(TS_ERR_INVALID_ARG), "cross_entropy: reduction '%s' (expected 'mean', "
                            "'sum' or 'none')", red);
    o.ignore_index = ignore;
    o.label_smoothing = ls;
    targs a;
    if (targs_get(&a, x, y, w, NULL) < 0) return NULL;
    o.weight = a.t[2];
    ts_tensor *out = NULL;
    ts_status st = a.t[1] ? ts_cross_entropy_ex(a.t[0], a.t[1], &o, &out)
                          : ts_error(TS_ERR_INVALID_ARG, "cross_entropy: target is None");
    targs_clear(&a);
    return result(st, out);
}

/* to(x, dtype=None, device=None): a copy on another device and/or in another dtype (gradients flow back) */
static PyObject *py_to(PyObject *m, PyObject *args, PyObject *kw) {
    (void)m;
    static char *names[] = {"x", "dtype", "device", NULL};
    PyObject *x;
    const char *dtype = NULL, *device = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|zz:to", names, &x, &dtype, &device)) return NULL;
    targs a;
    if (targs_get(&a, x, NULL, NULL, NULL) < 0) return NULL;
    ts_tensor *cur = ts_tensor_retain(a.t[0]), *next = NULL;
    ts_status st = TS_OK;
    if (device) {
        ts_device *dev = NULL;
        st = ts_device_get(device, &dev);
        if (st == TS_OK) st = ts_to_device(cur, dev, &next);
        if (st == TS_OK) ts_tensor_release(cur), cur = next, next = NULL;
    }
    if (st == TS_OK && dtype) {
        ts_dtype dt;
        st = ts_dtype_parse(dtype, &dt);
        if (st == TS_OK) st = ts_to_dtype(cur, dt, &next);
        if (st == TS_OK) ts_tensor_release(cur), cur = next, next = NULL;
    }
    targs_clear(&a);
    return result(st, cur);
}

/* scaled_dot_product_attention(q, k, v, is_causal=False, scale=None) */
static PyObject *py_sdpa(PyObject *m, PyObject *args, PyObject *kw) {
    (void)m;
    static char *names[] = {"q", "k", "v", "is_causal", "scale", NULL};
    PyObject *q, *k, *v, *scale = Py_None;
    int causal = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOO|pO:scaled_dot_product_attention", names, &q, &k, &v, &causal,
                                     &scale))
        return NULL;
    double s = scale == Py_None ? 0.0 : PyFloat_AsDouble(scale);
    if (s == -1.0 && PyErr_Occurred()) return NULL;
    targs a;
    if (targs_get(&a, q, k, v, NULL) < 0) return NULL;
    ts_tensor *out = NULL;
    ts_status st = a.t[1] && a.t[2] ? ts_scaled_dot_product_attention(a.t[0], a.t[1], a.t[2], causal, s, &out)
                                    : ts_error(TS_ERR_INVALID_ARG, "scaled_dot_product_attention: k or v is None");
    targs_clear(&a);
    return result(st, out);
}

/* ---- new tensors -------------------------------------------------------------------------------------------- */

/* _tensor_from_flat(values, shape, dtype, device): the values (a flat sequence of numbers) as a new tensor. */
static PyObject *py_tensor_from_flat(PyObject *m, PyObject *args) {
    (void)m;
    PyObject *values, *shape;
    const char *dtype, *device;
    if (!PyArg_ParseTuple(args, "OOss", &values, &shape, &dtype, &device)) return NULL;
    int64_t s[TS_MAX_DIMS];
    int nd = 0;
    if (tspy_int64_list(shape, "tensor: shape", s, &nd) < 0) return NULL;
    if (PyTuple_Check(shape) && PyTuple_Size(shape) == 0) nd = 0;
    ts_dtype dt;
    ts_device *dev = NULL;
    ts_status st = ts_dtype_parse(dtype, &dt);
    if (st == TS_OK) st = ts_device_get(device, &dev);
    if (st != TS_OK) return tspy_raise(st);
    if (dt != TS_F32 && dt != TS_I64)
        return PyErr_Format(tspy_error_class(TS_ERR_DTYPE), "tensor: dtype %s (from Python numbers: float32 or "
                            "int64; convert with tessera.ops.to)", dtype);
    PyObject *seq = PySequence_Fast(values, "tensor: expected a sequence of numbers");
    if (!seq) return NULL;
    Py_ssize_t n = PySequence_Size(seq);
    int64_t numel = 1;
    for (int i = 0; i < nd; i++) numel *= s[i];
    if (numel != n) {
        Py_DECREF(seq);
        return PyErr_Format(tspy_error_class(TS_ERR_SHAPE), "tensor: %zd values for shape of %lld elements", n,
                            (long long)numel);
    }
    void *buf = PyMem_Malloc(n ? (size_t)n * 8 : 8);
    for (Py_ssize_t i = 0; buf && i < n && !PyErr_Occurred(); i++) {
        PyObject *it = PySequence_GetItem(seq, i);
        if (!it) break;
        if (dt == TS_F32) ((float *)buf)[i] = (float)PyFloat_AsDouble(it);
        else ((int64_t *)buf)[i] = PyLong_AsLongLong(it);
        Py_DECREF(it);
    }
    Py_DECREF(seq);
    if (!buf || PyErr_Occurred()) {
        PyMem_Free(buf);
        return buf ? NULL : PyErr_NoMemory();
    }
    ts_tensor *t = NULL;
    st = ts_tensor_from_data(dev, dt, nd, s, buf, &t);
    PyMem_Free(buf);
    return result(st, t);
}

/* randn(shape, device='cpu') / rand(shape): float32 N(0, 1) / U(0, 1) from the default generator
 * (tessera.manual_seed). */
static PyObject *random_tensor(PyObject *args, PyObject *kw, const char *fmt, bool normal) {
    static char *names[] = {"shape", "device", NULL};
    PyObject *shape;
    const char *device = "cpu";
    int64_t s[TS_MAX_DIMS];
    int nd = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, fmt, names, &shape, &device) ||
        tspy_int64_list(shape, "shape", s, &nd) < 0)
        return NULL;
    ts_device *dev = NULL;
    ts_tensor *t = NULL;
    ts_status st = ts_device_get(device, &dev);
    if (st == TS_OK) st = ts_tensor_empty(dev, TS_F32, nd, s, &t);
    if (st == TS_OK) st = normal ? ts_tensor_normal_(t, 0.0f, 1.0f, NULL) : ts_tensor_uniform_(t, 0.0f, 1.0f, NULL);
    return result(st, t);
}

static PyObject *py_randn(PyObject *m, PyObject *args, PyObject *kw) {
    (void)m;
    return random_tensor(args, kw, "O|s:randn", true);
}

static PyObject *py_rand(PyObject *m, PyObject *args, PyObject *kw) {
    (void)m;
    return random_tensor(args, kw, "O|s:rand", false);
}

static PyObject *py_manual_seed(PyObject *m, PyObject *arg) {
    (void)m;
    unsigned long long s = PyLong_AsUnsignedLongLongMask(arg);
    if (PyErr_Occurred()) return NULL;
    ts_manual_seed(s);
    Py_RETURN_NONE;
}

/* _set_grad_enabled(on) -> the previous mode; is_grad_enabled() */
static PyObject *py_set_grad_enabled(PyObject *m, PyObject *arg) {
    (void)m;
    int on = PyObject_IsTrue(arg);
    if (on < 0) return NULL;
    return PyBool_FromLong(ts_grad_set_enabled(on));
}

static PyObject *py_is_grad_enabled(PyObject *m, PyObject *unused) {
    (void)m, (void)unused;
    return PyBool_FromLong(ts_grad_is_enabled());
}

/* ---- Tensor: operators and autograd ---------------------------------------------------------------------------- */

/* A binary operator: NotImplemented for operands that are neither tensors, numbers nor DLPack producers. */
static PyObject *binary_operator(ts_status (*fn)(const ts_tensor *, const ts_tensor *, ts_tensor **), PyObject *a,
                          PyObject *b) {
    if (!tspy_tensor_get(b) && !PyFloat_Check(b) && !PyLong_Check(b) && !PyObject_HasAttrString(b, "__dlpack__"))
        Py_RETURN_NOTIMPLEMENTED;
    return run_binary(fn, a, b);
}

static PyObject *t_add(PyObject *s, PyObject *o) { return binary_operator(ts_add, s, o); }
static PyObject *t_radd(PyObject *s, PyObject *o) { return binary_operator(ts_add, o, s); }
static PyObject *t_sub(PyObject *s, PyObject *o) { return binary_operator(ts_sub, s, o); }
static PyObject *t_rsub(PyObject *s, PyObject *o) { return binary_operator(ts_sub, o, s); }
static PyObject *t_truediv(PyObject *s, PyObject *o) { return binary_operator(ts_div, s, o); }
static PyObject *t_rtruediv(PyObject *s, PyObject *o) { return binary_operator(ts_div, o, s); }
static PyObject *t_matmul(PyObject *s, PyObject *o) { return binary_operator(ts_matmul, s, o); }
static PyObject *t_rmatmul(PyObject *s, PyObject *o) { return binary_operator(ts_matmul, o, s); }

/* x * number is ts_scale (exact, one op); tensors broadcast through ts_mul. */
static PyObject *t_mul(PyObject *s, PyObject *o) {
    if (PyFloat_Check(o) || PyLong_Check(o)) {
        double v = PyFloat_AsDouble(o);
        if (v == -1.0 && PyErr_Occurred()) return NULL;
        ts_tensor *out = NULL;
        ts_status st = ts_scale(tspy_tensor_get(s), (float)v, &out);
        return result(st, out);
    }
    return binary_operator(ts_mul, s, o);
}

static PyObject *t_neg(PyObject *s, PyObject *unused) {
    (void)unused;
    ts_tensor *out = NULL;
    ts_status st = ts_scale(tspy_tensor_get(s), -1.0f, &out);
    return result(st, out);
}

/* backward(gradient=None, retain_graph=False) */
static PyObject *t_backward(PyObject *s, PyObject *args, PyObject *kw) {
    static char *names[] = {"gradient", "retain_graph", NULL};
    PyObject *g = Py_None;
    int retain = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|Op:backward", names, &g, &retain)) return NULL;
    ts_tensor *grad = NULL;
    if (as_tensor_opt(g, &grad) < 0) return NULL;
    ts_tensor *t = tspy_tensor_get(s);
    ts_status st;
    Py_BEGIN_ALLOW_THREADS st = ts_backward(t, grad, retain);
    Py_END_ALLOW_THREADS
    ts_tensor_release(grad);
    if (st != TS_OK) return tspy_raise(st);
    Py_RETURN_NONE;
}

static PyObject *t_detach(PyObject *s, PyObject *unused) {
    (void)unused;
    ts_tensor *out = NULL;
    ts_status st = ts_tensor_detach(tspy_tensor_get(s), &out);
    return result(st, out);
}

static PyObject *t_clone(PyObject *s, PyObject *unused) {
    (void)unused;
    ts_tensor *out = NULL;
    ts_status st = ts_tensor_clone(tspy_tensor_get(s), &out);
    return result(st, out);
}

static PyObject *t_item(PyObject *s, PyObject *unused) {
    (void)unused;
    ts_tensor *t = tspy_tensor_get(s);
    if (ts_tensor_numel(t) != 1) {
        char b[128];
        return PyErr_Format(tspy_error_class(TS_ERR_SHAPE), "item: the tensor has shape %s, not one element",
                            ts_shape_str(ts_tensor_ndim(t), ts_tensor_shape(t), b, sizeof b));
    }
    double v = ts_tensor_item(t, 0);
    ts_dtype dt = ts_tensor_dtype(t);
    if (dt == TS_I64 || dt == TS_I32 || dt == TS_U8) return PyLong_FromLongLong((long long)v);
    return PyFloat_FromDouble(v);
}

/* requires_grad_(on=True) -> self */
static PyObject *t_requires_grad_(PyObject *s, PyObject *args) {
    int on = 1;
    if (!PyArg_ParseTuple(args, "|p:requires_grad_", &on)) return NULL;
    ts_tensor *t = tspy_tensor_get(s);
    if (on && !ts_tensor_is_leaf(t))
        return PyErr_Format(tspy_error_class(TS_ERR_INVALID_ARG), "requires_grad_: only a leaf tensor (not the "
                            "result of an op that records autograd) can be made to require grad; detach() it first");
    if (on && ts_tensor_dtype(t) != TS_F32 && ts_tensor_dtype(t) != TS_F16 && ts_tensor_dtype(t) != TS_BF16)
        return PyErr_Format(tspy_error_class(TS_ERR_DTYPE), "requires_grad_: a %s tensor cannot require grad (only "
                            "floating point tensors)", ts_dtype_name(ts_tensor_dtype(t)));
    ts_tensor_set_requires_grad(t, on);
    return Py_NewRef(s);
}

static PyObject *t_get_requires_grad(PyObject *s, void *c) {
    (void)c;
    return PyBool_FromLong(ts_tensor_requires_grad(tspy_tensor_get(s)));
}

static int t_set_requires_grad(PyObject *s, PyObject *v, void *c) {
    (void)c;
    if (!v) {
        PyErr_SetString(PyExc_AttributeError, "requires_grad cannot be deleted");
        return -1;
    }
    PyObject *args = Py_BuildValue("(O)", v);
    PyObject *r = args ? t_requires_grad_(s, args) : NULL;
    Py_XDECREF(args);
    Py_XDECREF(r);
    return r ? 0 : -1;
}

static PyObject *t_get_grad(PyObject *s, void *c) {
    (void)c;
    ts_tensor *g = ts_tensor_grad(tspy_tensor_get(s));
    return g ? tspy_tensor_wrap(ts_tensor_retain(g)) : Py_NewRef(Py_None);
}

static int t_set_grad(PyObject *s, PyObject *v, void *c) {
    (void)c;
    ts_tensor *t = tspy_tensor_get(s), *g = NULL;
    if (v && v != Py_None && as_tensor(v, NULL, &g) < 0) return -1;
    ts_tensor_set_grad(t, g); /* retains g; NULL clears */
    ts_tensor_release(g);
    return 0;
}

static PyObject *t_is_leaf(PyObject *s, void *c) {
    (void)c;
    return PyBool_FromLong(ts_tensor_is_leaf(tspy_tensor_get(s)));
}

static PyMethodDef tensor_extra_methods[] = {
    {"__add__", t_add, METH_O, NULL},
    {"__radd__", t_radd, METH_O, NULL},
    {"__sub__", t_sub, METH_O, NULL},
    {"__rsub__", t_rsub, METH_O, NULL},
    {"__mul__", t_mul, METH_O, NULL},
    {"__rmul__", t_mul, METH_O, NULL},
    {"__truediv__", t_truediv, METH_O, NULL},
    {"__rtruediv__", t_rtruediv, METH_O, NULL},
    {"__matmul__", t_matmul, METH_O, NULL},
    {"__rmatmul__", t_rmatmul, METH_O, NULL},
    {"__neg__", t_neg, METH_NOARGS, NULL},
    {"backward", TSPY_KW(t_backward),
     "backward(gradient=None, retain_graph=False): gradients of this tensor into the leaves' .grad (gradient None: "
     "this tensor must have one element)."},
    {"detach", t_detach, METH_NOARGS, "detach() -> Tensor: the same memory without autograd history."},
    {"clone", t_clone, METH_NOARGS, "clone() -> Tensor: a contiguous copy (no autograd)."},
    {"item", t_item, METH_NOARGS, "item() -> float or int: the one element."},
    {"requires_grad_", t_requires_grad_, METH_VARARGS,
     "requires_grad_(on=True) -> self: a leaf whose .grad backward fills."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef tensor_extra_getset[] = {
    {"requires_grad", t_get_requires_grad, t_set_requires_grad, "Whether ops on it record autograd (leaves).", NULL},
    {"grad", t_get_grad, t_set_grad, "The gradient backward accumulated into this leaf, or None.", NULL},
    {"is_leaf", t_is_leaf, NULL, "Whether no op recorded it (a leaf of the autograd graph).", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

/* Adds the methods and properties to tessera.Tensor (setting a dunder on a heap type fills its slot). */
static int add_tensor_extras(void) {
    PyTypeObject *tp = tspy_tensor_type();
    for (PyMethodDef *d = tensor_extra_methods; d->ml_name; d++) {
        PyObject *o = PyDescr_NewMethod(tp, d);
        int r = o ? PyObject_SetAttrString((PyObject *)tp, d->ml_name, o) : -1;
        Py_XDECREF(o);
        if (r < 0) return -1;
    }
    for (PyGetSetDef *g = tensor_extra_getset; g->name; g++) {
        PyObject *o = PyDescr_NewGetSet(tp, g);
        int r = o ? PyObject_SetAttrString((PyObject *)tp, g->name, o) : -1;
        Py_XDECREF(o);
        if (r < 0) return -1;
    }
    return 0;
}

/* ---- the module's functions -------------------------------------------------------------------------------------- */

#define UNARY_DEF(name, fn, doc) {#name, py_##name, METH_O, doc},
#define BINARY_DEF(name, fn, doc) {#name, (PyCFunction)(void (*)(void))py_##name, METH_FASTCALL, doc},
static PyMethodDef ops_methods[] = {
    UNARY_OPS(UNARY_DEF) BINARY_OPS(BINARY_DEF)
    {"scale", py_scale, METH_VARARGS, "scale(x, s) -> s * x"},
    {"gelu", TSPY_KW(py_gelu), "gelu(x, approximate='none'|'tanh')"},
    {"softmax", TSPY_KW(py_softmax), "softmax(x, dim)"},
    {"log_softmax", TSPY_KW(py_log_softmax), "log_softmax(x, dim)"},
    {"sum", TSPY_KW(py_sum), "sum(x, dim=None, keepdim=False): all elements (shape ()) or over dim (an int or ints)"},
    {"mean", TSPY_KW(py_mean), "mean(x, dim=None, keepdim=False)"},
    {"max", TSPY_KW(py_max), "max(x, dim, keepdim=False) -> (values, indices): torch.max over dim"},
    {"linear", TSPY_KW(py_linear), "linear(x, weight, bias=None) -> x weight^T + bias"},
    {"conv2d", TSPY_KW(py_conv2d), "conv2d(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1)"},
    {"max_pool2d", TSPY_KW(py_max_pool2d), "max_pool2d(x, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False)"},
    {"avg_pool2d", TSPY_KW(py_avg_pool2d),
     "avg_pool2d(x, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True)"},
    {"adaptive_avg_pool2d", TSPY_KW(py_adaptive_avg_pool2d), "adaptive_avg_pool2d(x, output_size)"},
    {"batch_norm", TSPY_KW(py_batch_norm),
     "batch_norm(x, running_mean, running_var, weight=None, bias=None, training=False, momentum=0.1, eps=1e-5)"},
    {"layer_norm", TSPY_KW(py_layer_norm), "layer_norm(x, normalized_shape, weight=None, bias=None, eps=1e-5)"},
    {"group_norm", TSPY_KW(py_group_norm), "group_norm(x, num_groups, weight=None, bias=None, eps=1e-5)"},
    {"reshape", TSPY_KW(py_reshape), "reshape(x, shape) (one entry may be -1)"},
    {"flatten", TSPY_KW(py_flatten), "flatten(x, start_dim=0, end_dim=-1)"},
    {"transpose", TSPY_KW(py_transpose), "transpose(x, dim0, dim1) (a contiguous copy)"},
    {"permute", TSPY_KW(py_permute), "permute(x, dims) (a contiguous copy)"},
    {"narrow", TSPY_KW(py_narrow), "narrow(x, dim, start, length)"},
    {"cat", TSPY_KW(py_cat), "cat(tensors, dim=0)"},
    {"dropout", TSPY_KW(py_dropout), "dropout(x, p=0.5, training=True): inverted dropout"},
    {"cross_entropy", TSPY_KW(py_cross_entropy),
     "cross_entropy(input, target, weight=None, ignore_index=-100, reduction='mean', label_smoothing=0.0)"},
    {"scaled_dot_product_attention", TSPY_KW(py_sdpa),
     "scaled_dot_product_attention(q, k, v, is_causal=False, scale=None): softmax(scale q k^T + mask) v"},
    {"to", TSPY_KW(py_to), "to(x, dtype=None, device=None): a copy in another dtype or on another device"},
    {"_tensor_from_flat", py_tensor_from_flat, METH_VARARGS, "_tensor_from_flat(values, shape, dtype, device)"},
    {"randn", TSPY_KW(py_randn), "randn(shape, device='cpu'): float32 N(0, 1) (tessera.manual_seed)"},
    {"rand", TSPY_KW(py_rand), "rand(shape, device='cpu'): float32 U(0, 1)"},
    {"manual_seed", py_manual_seed, METH_O, "manual_seed(seed): the default generator's seed"},
    {"_set_grad_enabled", py_set_grad_enabled, METH_O, "_set_grad_enabled(on) -> the previous mode (this thread)"},
    {"is_grad_enabled", py_is_grad_enabled, METH_NOARGS, "is_grad_enabled() -> bool (this thread)"},
    {NULL, NULL, 0, NULL},
};

int tspy_add_ops(PyObject *m) {
    if (add_tensor_extras() < 0 || PyModule_AddFunctions(m, ops_methods) < 0) return -1;
    return tspy_add_modules(m);
}
