/*
 * ops/cuda/ew.c — the elementwise kernel table (device/k_ew.h) for CUDA devices: checks dtypes,
 * turns shapes and strides into the launchers' index walks (size-1 dims dropped, adjacent dims
 * merged where both stride sets allow) and calls the launchers of ops/cuda/ew.cu on the device's
 * stream. Nothing here waits for the GPU.
 */
#include "ops/cuda/common.h"
#include "device/k_ew.h"
#include "ops/cuda/ew_cu.h"
#include "device/k_elem.h"

_Static_assert(TS_CU_MAX_DIMS == TS_MAX_DIMS, "ew_cu.h's TS_CU_MAX_DIMS");
_Static_assert((int)TS_BIN_ADD == TS_ELEM_ADD && (int)TS_BIN_SUB == TS_ELEM_SUB && (int)TS_BIN_MUL == TS_ELEM_MUL &&
                   (int)TS_BIN_DIV == TS_ELEM_DIV,
               "device/k_elem.h's binary op numbers");
_Static_assert((int)TS_UN_SIGMOID == TS_ELEM_SIGMOID && (int)TS_UN_TANH == TS_ELEM_TANH &&
                   (int)TS_UN_GELU == TS_ELEM_GELU && (int)TS_UN_GELU_TANH == TS_ELEM_GELU_TANH &&
                   (int)TS_UN_SILU == TS_ELEM_SILU,
               "device/k_elem.h's unary op numbers");

static ts_status need_f32(const char *op, const ts_tensor *t) {
    if (t->dtype == TS_F32) return TS_OK;
    return ts_error(TS_ERR_DTYPE, "%s on %s: %s tensor (want float32)", op, ts__dev(t)->name,
                    ts_dtype_name(t->dtype));
}

/* The walk over shape (nd dims) with strides a and b (b NULL: zeros), coalesced: size-1 dims
 * dropped, dim d folded into d-1 when a[d-1] = a[d] shape[d] and the same for b (the flat index
 * order is unchanged). */
static ts_cu_walk make_walk(int nd, const int64_t *shape, const int64_t *a, const int64_t *b) {
    ts_cu_walk w = {0};
    for (int d = 0; d < nd; d++) {
        int64_t sz = shape[d], sa = a[d], sb = b ? b[d] : 0;
        if (sz == 1) continue;
        int k = w.ndim - 1;
        if (k >= 0 && w.a[k] == sa * sz && w.b[k] == sb * sz) {
            w.shape[k] *= sz;
            w.a[k] = sa;
            w.b[k] = sb;
        } else {
            w.shape[w.ndim] = sz;
            w.a[w.ndim] = sa;
            w.b[w.ndim] = sb;
            w.ndim++;
        }
    }
    return w;
}

/* Device scratch (NULL for 0 bytes). Freed right after the kernels that use it are queued: the
 * device's one stream runs them before any later user of the block. */
static ts_status scratch_get(ts_device *dev, size_t bytes, void **p) {
    *p = NULL;
    if (bytes == 0) return TS_OK;
    *p = ts__device_alloc(dev, bytes);
    return *p ? TS_OK : TS_ERR_NOMEM;
}

static ts_status cuda_fill(ts_tensor *out, float v) {
    ts_device *dev = ts__dev(out);
    TS_TRY(need_f32("fill", out));
    TS_CU_BEGIN(dev, s);
    TS_CU_LAUNCH(dev, "ew.fill", ts_cu_fill(ts__f32(out), ts_tensor_numel(out), v, s));
    return TS_OK;
}

/* out = x, same shape and dtype, any strides on either side */
static ts_status cuda_copy(ts_tensor *out, const ts_tensor *x) {
    ts_device *dev = ts__dev(out);
    size_t es = ts_dtype_size(x->dtype);
    if (es != 1 && es != 2 && es != 4 && es != 8)
        return ts_error(TS_ERR_DTYPE, "copy on %s: %s elements", dev->name, ts_dtype_name(x->dtype));
    int64_t n = ts_tensor_numel(out);
    if (n == 0) return TS_OK;
    TS_CU_BEGIN(dev, s);
    if (ts_tensor_is_contiguous(out) && ts_tensor_is_contiguous(x)) {
        TS_CU_LAUNCH(dev, "ew.copy", ts_cu_memcpy(ts__ptr(out), ts__ptr(x), (size_t)n * es, s));
        return TS_OK;
    }
    ts_cu_walk w = make_walk(x->ndim, x->shape, out->stride, x->stride);
    TS_CU_LAUNCH(dev, "ew.copy", ts_cu_strided_copy(ts__ptr(out), ts__ptr(x), (int)es, &w, s));
    return TS_OK;
}

/* Whether a and b are read contiguously over out's shape (their strides those of out's layout). */
static bool flat_operands(const ts_tensor *out, const int64_t *astr, const int64_t *bstr) {
    int64_t c = 1;
    for (int d = out->ndim - 1; d >= 0; d--) {
        if (out->shape[d] != 1 && (astr[d] != c || bstr[d] != c)) return false;
        c *= out->shape[d];
    }
    return true;
}

static ts_status cuda_binary(ts_binop op, ts_tensor *out, const ts_tensor *a, const int64_t *astr,
                             const ts_tensor *b, const int64_t *bstr) {
    ts_device *dev = ts__dev(out);
    if (out->dtype == TS_BF16) { /* bfloat16 activations: the residual add, as the CPU's */
        if (op != TS_BIN_ADD || a->dtype != TS_BF16 || b->dtype != TS_BF16 || !flat_operands(out, astr, bstr))
            return ts_error(TS_ERR_UNSUPPORTED, "binary on %s in bfloat16: only the add of two contiguous bfloat16 "
                            "tensors of one shape", dev->name);
        TS_CU_BEGIN(dev, s);
        TS_CU_LAUNCH(dev, "ew.binary", ts_cu_add_bf16(ts__ptr(out), ts__ptr(a), ts__ptr(b), ts_tensor_numel(out), s));
        return TS_OK;
    }
    TS_TRY(need_f32("binary", out));
    TS_TRY(need_f32("binary", a));
    TS_TRY(need_f32("binary", b));
    int nd = out->ndim;
    int64_t n = ts_tensor_numel(out);
    if (n == 0) return TS_OK;
    const bool flat = flat_operands(out, astr, bstr); /* a and b read contiguously, as out */
    TS_CU_BEGIN(dev, s);
    ts_cu_walk w = make_walk(nd, out->shape, astr, bstr);
    TS_CU_LAUNCH(dev, "ew.binary",
                 ts_cu_binary((int)op, ts__f32(out), ts__f32(a), ts__f32(b), n, flat ? NULL : &w, s));
    return TS_OK;
}

static ts_status cuda_scale(ts_tensor *out, const ts_tensor *x, float v) {
    ts_device *dev = ts__dev(out);
    TS_TRY(need_f32("scale", out));
    TS_TRY(need_f32("scale", x));
    TS_CU_BEGIN(dev, s);
    TS_CU_LAUNCH(dev, "ew.scale", ts_cu_scale(ts__f32(out), ts__f32(x), v, ts_tensor_numel(out), s));
    return TS_OK;
}

static ts_status cuda_axpy(ts_tensor *y, float alpha, const ts_tensor *x) {
    ts_device *dev = ts__dev(y);
    if (y->dtype != x->dtype)
        return ts_error(TS_ERR_DTYPE, "axpy on %s: %s += %s", dev->name, ts_dtype_name(y->dtype),
                        ts_dtype_name(x->dtype));
    if (y->dtype == TS_BF16 || y->dtype == TS_F16) { /* autograd's sum of two 16-bit gradients */
        TS_CU_BEGIN(dev, s);
        TS_CU_LAUNCH(dev, "ew.axpy",
                     ts_cu_axpy16(y->dtype == TS_BF16 ? TS_CU_BF16 : TS_CU_F16, ts__ptr(y), alpha, ts__ptr(x),
                                  ts_tensor_numel(y), s));
        return TS_OK;
    }
    TS_TRY(need_f32("axpy", y));
    TS_TRY(need_f32("axpy", x));
    TS_CU_BEGIN(dev, s);
    TS_CU_LAUNCH(dev, "ew.axpy", ts_cu_axpy(ts__f32(y), alpha, ts__f32(x), ts_tensor_numel(y), s));
    return TS_OK;
}

static ts_status cuda_relu(ts_tensor *out, const ts_tensor *x) {
    ts_device *dev = ts__dev(out);
    if (x->dtype == TS_BF16 && out->dtype == TS_BF16) {
        TS_CU_BEGIN(dev, s);
        TS_CU_LAUNCH(dev, "ew.relu", ts_cu_relu_bf16(ts__ptr(out), ts__ptr(x), ts_tensor_numel(out), s));
        return TS_OK;
    }
    TS_TRY(need_f32("relu", out));
    TS_TRY(need_f32("relu", x));
    TS_CU_BEGIN(dev, s);
    TS_CU_LAUNCH(dev, "ew.relu", ts_cu_relu(ts__f32(out), ts__f32(x), ts_tensor_numel(out), s));
    return TS_OK;
}

static ts_status cuda_relu_backward(ts_tensor *gx, const ts_tensor *gy, const ts_tensor *y) {
    ts_device *dev = ts__dev(gx);
    if (gx->dtype == TS_BF16 && gy->dtype == TS_BF16 && y->dtype == TS_BF16) {
        TS_CU_BEGIN(dev, s);
        TS_CU_LAUNCH(dev, "ew.relu_backward",
                     ts_cu_relu_backward_bf16(ts__ptr(gx), ts__ptr(gy), ts__ptr(y), ts_tensor_numel(gx), s));
        return TS_OK;
    }
    TS_TRY(need_f32("relu_backward", gx));
    TS_TRY(need_f32("relu_backward", gy));
    TS_TRY(need_f32("relu_backward", y));
    TS_CU_BEGIN(dev, s);
    TS_CU_LAUNCH(dev, "ew.relu_backward",
                 ts_cu_relu_backward(ts__f32(gx), ts__f32(gy), ts__f32(y), ts_tensor_numel(gx), s));
    return TS_OK;
}

/* x: (rows, n) -> out: (rows) = alpha * row sums, in double */
static ts_status rowsum(ts_device *dev, cudaStream_t s, const char *what, float *out, const float *x, int64_t rows,
                        int64_t n, float alpha) {
    size_t bytes = ts_cu_rowsum_scratch(rows, n);
    void *scratch;
    TS_TRY(scratch_get(dev, bytes, &scratch));
    ts_status st = ts__cuda_status(dev, ts_cu_rowsum(out, x, rows, n, alpha, scratch, s), what);
    ts__device_free(dev, scratch, bytes);
    return st;
}

/* out[j] = the sum of the x elements that map to j (out's strides ostr over x's dims, 0 on reduced ones) */
static ts_status cuda_reduce_to(ts_tensor *out, const ts_tensor *x, const int64_t *ostr) {
    ts_device *dev = ts__dev(out);
    TS_TRY(need_f32("reduce_to", out));
    TS_TRY(need_f32("reduce_to", x));
    int64_t n = ts_tensor_numel(x), on = ts_tensor_numel(out);
    TS_CU_BEGIN(dev, s);
    if (on == 1) return rowsum(dev, s, "ew.reduce_to", ts__f32(out), ts__f32(x), 1, n, 1.0f); /* in double */
    if (on == 0) return TS_OK;
    /* x's dims split into kept ones (out's index) and reduced ones (the terms of one sum) */
    int nd = x->ndim, nk = 0, nr = 0;
    int64_t ksh[TS_MAX_DIMS], kx[TS_MAX_DIMS], ko[TS_MAX_DIMS], rsh[TS_MAX_DIMS], rx[TS_MAX_DIMS];
    for (int d = 0; d < nd; d++) {
        if (ostr[d] != 0 || x->shape[d] == 1) {
            ksh[nk] = x->shape[d];
            kx[nk] = x->stride[d];
            ko[nk++] = ostr[d];
        } else {
            rsh[nr] = x->shape[d];
            rx[nr++] = x->stride[d];
        }
    }
    ts_cu_walk kept = make_walk(nk, ksh, kx, ko), red = make_walk(nr, rsh, rx, NULL);
    int64_t m = on ? n / on : 0;
    TS_CU_LAUNCH(dev, "ew.reduce_to", ts_cu_reduce_to(ts__f32(out), ts__f32(x), on, &kept, m, &red, s));
    return TS_OK;
}

static ts_status cuda_sum_all(ts_tensor *out, const ts_tensor *x) {
    ts_device *dev = ts__dev(out);
    TS_TRY(need_f32("sum_all", out));
    TS_TRY(need_f32("sum_all", x));
    TS_CU_BEGIN(dev, s);
    return rowsum(dev, s, "ew.sum_all", ts__f32(out), ts__f32(x), 1, ts_tensor_numel(x), 1.0f);
}

static ts_status cuda_expand_scalar(ts_tensor *out, const ts_tensor *sc, float alpha) {
    ts_device *dev = ts__dev(out);
    TS_TRY(need_f32("expand_scalar", out));
    TS_TRY(need_f32("expand_scalar", sc));
    TS_CU_BEGIN(dev, s);
    TS_CU_LAUNCH(dev, "ew.expand_scalar",
                 ts_cu_expand_scalar(ts__f32(out), ts_tensor_numel(out), ts__f32(sc), alpha, s));
    return TS_OK;
}

static ts_status cuda_unary(ts_unop op, ts_tensor *out, const ts_tensor *x) {
    ts_device *dev = ts__dev(out);
    TS_TRY(need_f32("unary", out));
    TS_TRY(need_f32("unary", x));
    TS_CU_BEGIN(dev, s);
    TS_CU_LAUNCH(dev, "ew.unary", ts_cu_unary((int)op, ts__f32(out), ts__f32(x), ts_tensor_numel(out), s));
    return TS_OK;
}

/* sigmoid and tanh read y, the others x */
static ts_status cuda_unary_backward(ts_unop op, ts_tensor *gx, const ts_tensor *gy, const ts_tensor *x,
                                     const ts_tensor *y) {
    ts_device *dev = ts__dev(gx);
    bool from_y = op == TS_UN_SIGMOID || op == TS_UN_TANH;
    const ts_tensor *v = from_y ? y : x;
    if (!v)
        return ts_error(TS_ERR_INVALID_ARG, "unary_backward on %s: NULL forward %s", dev->name,
                        from_y ? "output y" : "input x");
    TS_TRY(need_f32("unary_backward", gx));
    TS_TRY(need_f32("unary_backward", gy));
    TS_TRY(need_f32("unary_backward", v));
    TS_CU_BEGIN(dev, s);
    TS_CU_LAUNCH(dev, "ew.unary_backward",
                 ts_cu_unary_backward((int)op, ts__f32(gx), ts__f32(gy), ts__f32(v), ts_tensor_numel(gx), s));
    return TS_OK;
}

// out: (outer, inner) = alpha * sum over the middle dim of x: (outer, n, inner)
static ts_status cuda_sum_dim(ts_tensor *out, const ts_tensor *x, int64_t outer, int64_t n, int64_t inner,
                              float alpha) {
    ts_device *dev = ts__dev(out);
    TS_TRY(need_f32("sum_dim", out));
    TS_TRY(need_f32("sum_dim", x));
    TS_CU_BEGIN(dev, s);
    if (inner == 1) return rowsum(dev, s, "ew.sum_dim", ts__f32(out), ts__f32(x), outer, n, alpha); /* double */
    TS_CU_LAUNCH(dev, "ew.sum_dim", ts_cu_colsum(ts__f32(out), ts__f32(x), outer, n, inner, alpha, s)); /* float */
    return TS_OK;
}

// out: (outer, n, inner) = alpha * x: (outer, inner) along the middle dim
static ts_status cuda_expand_dim(ts_tensor *out, const ts_tensor *x, int64_t outer, int64_t n, int64_t inner,
                                 float alpha) {
    ts_device *dev = ts__dev(out);
    TS_TRY(need_f32("expand_dim", out));
    TS_TRY(need_f32("expand_dim", x));
    TS_CU_BEGIN(dev, s);
    TS_CU_LAUNCH(dev, "ew.expand_dim", ts_cu_expand_dim(ts__f32(out), ts__f32(x), outer, n, inner, alpha, s));
    return TS_OK;
}

// values, indices: (outer, inner) = max / first argmax over the middle dim of x: (outer, n, inner)
static ts_status cuda_max_dim(ts_tensor *values, ts_tensor *indices, const ts_tensor *x, int64_t outer, int64_t n,
                              int64_t inner) {
    ts_device *dev = ts__dev(values);
    TS_TRY(need_f32("max_dim", values));
    TS_TRY(need_f32("max_dim", x));
    if (indices->dtype != TS_I64)
        return ts_error(TS_ERR_DTYPE, "max_dim on %s: %s indices (want int64)", dev->name,
                        ts_dtype_name(indices->dtype));
    TS_CU_BEGIN(dev, s);
    TS_CU_LAUNCH(dev, "ew.max_dim",
                 ts_cu_max_dim(ts__f32(values), (int64_t *)ts__ptr(indices), ts__f32(x), outer, n, inner, s));
    return TS_OK;
}

// gx: (outer, n, inner) = g: (outer, inner) at indices along the middle dim, 0 elsewhere
static ts_status cuda_max_dim_backward(ts_tensor *gx, const ts_tensor *g, const ts_tensor *indices, int64_t outer,
                                       int64_t n, int64_t inner) {
    ts_device *dev = ts__dev(gx);
    TS_TRY(need_f32("max_dim_backward", gx));
    TS_TRY(need_f32("max_dim_backward", g));
    if (indices->dtype != TS_I64)
        return ts_error(TS_ERR_DTYPE, "max_dim_backward on %s: %s indices (want int64)", dev->name,
                        ts_dtype_name(indices->dtype));
    TS_CU_BEGIN(dev, s);
    TS_CU_LAUNCH(dev, "ew.max_dim_backward",
                 ts_cu_max_dim_backward(ts__f32(gx), ts__f32(g), (const int64_t *)ts__ptr(indices), outer, n,
                                        inner, s));
    return TS_OK;
}

/* out = x with dims permuted (out dim d = x dim perm[d]), any dtype: a gather over out's index */
static ts_status cuda_permute(ts_tensor *out, const ts_tensor *x, const int *perm) {
    ts_device *dev = ts__dev(out);
    size_t es = ts_dtype_size(x->dtype);
    if (es != 1 && es != 2 && es != 4 && es != 8)
        return ts_error(TS_ERR_DTYPE, "permute on %s: %s elements", dev->name, ts_dtype_name(x->dtype));
    if (ts_tensor_numel(out) == 0) return TS_OK;
    int64_t xs[TS_MAX_DIMS];
    for (int d = 0; d < out->ndim; d++) xs[d] = x->stride[perm[d]];
    ts_cu_walk w = make_walk(out->ndim, out->shape, out->stride, xs);
    TS_CU_BEGIN(dev, s);
    TS_CU_LAUNCH(dev, "ew.permute", ts_cu_strided_copy(ts__ptr(out), ts__ptr(x), (int)es, &w, s));
    return TS_OK;
}

static int cu_float_type(ts_dtype dt) {
    return dt == TS_F32 ? TS_CU_F32 : dt == TS_F16 ? TS_CU_F16 : dt == TS_BF16 ? TS_CU_BF16 : -1;
}

/* out = x in out's dtype (F32, F16, BF16; both contiguous), rounding to nearest even as core/half.h */
static ts_status cuda_cast(ts_tensor *out, const ts_tensor *x) {
    ts_device *dev = ts__dev(out);
    int to = cu_float_type(out->dtype), from = cu_float_type(x->dtype);
    if (to < 0 || from < 0)
        return ts_error(TS_ERR_DTYPE, "cast: %s to %s (want float32, float16 or bfloat16)", ts_dtype_name(x->dtype),
                        ts_dtype_name(out->dtype));
    int64_t n = ts_tensor_numel(x);
    if (n == 0) return TS_OK;
    TS_CU_BEGIN(dev, s);
    if (to == from)
        TS_CU_LAUNCH(dev, "ew.cast", ts_cu_memcpy(ts__ptr(out), ts__ptr(x), (size_t)n * ts_dtype_size(x->dtype), s));
    else
        TS_CU_LAUNCH(dev, "ew.cast", ts_cu_cast(ts__ptr(out), to, ts__ptr(x), from, n, s));
    return TS_OK;
}

const struct ts_kernels_ew ts_cuda_kernels_ew = {
    .fill = cuda_fill,
    .copy = cuda_copy,
    .binary = cuda_binary,
    .scale = cuda_scale,
    .axpy = cuda_axpy,
    .relu = cuda_relu,
    .relu_backward = cuda_relu_backward,
    .reduce_to = cuda_reduce_to,
    .sum_all = cuda_sum_all,
    .expand_scalar = cuda_expand_scalar,
    .unary = cuda_unary,
    .unary_backward = cuda_unary_backward,
    .sum_dim = cuda_sum_dim,
    .expand_dim = cuda_expand_dim,
    .max_dim = cuda_max_dim,
    .max_dim_backward = cuda_max_dim_backward,
    .permute = cuda_permute,
    .cast = cuda_cast,
    .bf16 = true,
};
