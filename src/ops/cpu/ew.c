/*
 * ops/cpu/ew.c — elementwise kernels on the CPU (OpenMP over elements).
 * Fast paths for contiguous, same-shape operands; a general strided walk
 * (an odometer over the output's index) for broadcasting and views.
 */
#include "tensor/tensor.h"
#include "device/k_ew.h"

#include <omp.h>

#define PAR_MIN 32768 /* below this many elements, stay on one thread */

static ts_status cpu_fill(ts_tensor *out, float v) {
    float *o = ts__f32(out);
    int64_t n = ts_tensor_numel(out);
#pragma omp parallel for if (n > PAR_MIN) schedule(static)
    for (int64_t i = 0; i < n; i++) o[i] = v;
    return TS_OK;
}

/* Offset of flat index i (in `shape` order) under strides str. */
static inline int64_t strided_offset(int ndim, const int64_t *shape, const int64_t *str, int64_t i) {
    int64_t off = 0;
    for (int d = ndim - 1; d >= 0; d--) {
        int64_t q = i / shape[d];
        off += (i - q * shape[d]) * str[d];
        i = q;
    }
    return off;
}

static ts_status cpu_copy(ts_tensor *out, const ts_tensor *x) {
    size_t es = ts_dtype_size(x->dtype);
    int64_t n = ts_tensor_numel(out);
    if (ts_tensor_is_contiguous(x) && ts_tensor_is_contiguous(out)) {
        memcpy(ts__ptr(out), ts__ptr(x), (size_t)n * es);
        return TS_OK;
    }
    const char *src = ts__ptr(x);
    char *dst = ts__ptr(out);
    /* copy rows of the innermost dim */
    int nd = x->ndim;
    int64_t inner = nd ? x->shape[nd - 1] : 1, istr = nd ? x->stride[nd - 1] : 1;
    int64_t rows = inner ? n / inner : 0;
#pragma omp parallel for if (n > PAR_MIN) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        int64_t off = nd > 1 ? strided_offset(nd - 1, x->shape, x->stride, r) : 0;
        int64_t ooff = ts_tensor_is_contiguous(out) ? r * inner : strided_offset(nd - 1, out->shape, out->stride, r);
        for (int64_t j = 0; j < inner; j++) {
            int64_t oj = ts_tensor_is_contiguous(out) ? j : j * out->stride[nd - 1];
            memcpy(dst + (size_t)(ooff + oj) * es, src + (size_t)(off + j * istr) * es, es);
        }
    }
    return TS_OK;
}

static ts_status cpu_binary(ts_binop op, ts_tensor *out, const ts_tensor *a, const int64_t *astr, const ts_tensor *b,
                            const int64_t *bstr) {
    float *o = ts__f32(out);
    const float *pa = ts__f32(a), *pb = ts__f32(b);
    int nd = out->ndim;
    int64_t n = ts_tensor_numel(out);
    bool fast = true;
    int64_t s = 1;
    for (int d = nd - 1; d >= 0; d--) {
        if (out->shape[d] != 1 && (astr[d] != s || bstr[d] != s)) fast = false;
        s *= out->shape[d];
    }
    if (fast) {
        switch (op) {
        case TS_BIN_ADD:
#pragma omp parallel for if (n > PAR_MIN) schedule(static)
            for (int64_t i = 0; i < n; i++) o[i] = pa[i] + pb[i];
            break;
        case TS_BIN_SUB:
#pragma omp parallel for if (n > PAR_MIN) schedule(static)
            for (int64_t i = 0; i < n; i++) o[i] = pa[i] - pb[i];
            break;
        case TS_BIN_MUL:
#pragma omp parallel for if (n > PAR_MIN) schedule(static)
            for (int64_t i = 0; i < n; i++) o[i] = pa[i] * pb[i];
            break;
        }
        return TS_OK;
    }
    int64_t inner = nd ? out->shape[nd - 1] : 1;
    int64_t rows = inner ? n / inner : 0;
    int64_t ai = nd ? astr[nd - 1] : 0, bi = nd ? bstr[nd - 1] : 0;
#pragma omp parallel for if (n > PAR_MIN) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        const float *ra = pa + strided_offset(nd - 1, out->shape, astr, r);
        const float *rb = pb + strided_offset(nd - 1, out->shape, bstr, r);
        float *ro = o + r * inner;
        for (int64_t j = 0; j < inner; j++) {
            float x = ra[j * ai], y = rb[j * bi];
            ro[j] = op == TS_BIN_ADD ? x + y : op == TS_BIN_SUB ? x - y : x * y;
        }
    }
    return TS_OK;
}

static ts_status cpu_scale(ts_tensor *out, const ts_tensor *x, float s) {
    float *o = ts__f32(out);
    const float *p = ts__f32(x);
    int64_t n = ts_tensor_numel(out);
#pragma omp parallel for if (n > PAR_MIN) schedule(static)
    for (int64_t i = 0; i < n; i++) o[i] = s * p[i];
    return TS_OK;
}

static ts_status cpu_axpy(ts_tensor *y, float alpha, const ts_tensor *x) {
    float *o = ts__f32(y);
    const float *p = ts__f32(x);
    int64_t n = ts_tensor_numel(y);
    if (alpha == 1.0f) {
#pragma omp parallel for if (n > PAR_MIN) schedule(static)
        for (int64_t i = 0; i < n; i++) o[i] += p[i];
    } else {
#pragma omp parallel for if (n > PAR_MIN) schedule(static)
        for (int64_t i = 0; i < n; i++) o[i] += alpha * p[i];
    }
    return TS_OK;
}

static ts_status cpu_relu(ts_tensor *out, const ts_tensor *x) {
    float *o = ts__f32(out);
    const float *p = ts__f32(x);
    int64_t n = ts_tensor_numel(out);
#pragma omp parallel for if (n > PAR_MIN) schedule(static)
    for (int64_t i = 0; i < n; i++) o[i] = p[i] > 0.0f ? p[i] : 0.0f;
    return TS_OK;
}

static ts_status cpu_relu_backward(ts_tensor *gx, const ts_tensor *gy, const ts_tensor *y) {
    float *o = ts__f32(gx);
    const float *g = ts__f32(gy), *p = ts__f32(y);
    int64_t n = ts_tensor_numel(gx);
#pragma omp parallel for if (n > PAR_MIN) schedule(static)
    for (int64_t i = 0; i < n; i++) o[i] = p[i] > 0.0f ? g[i] : 0.0f;
    return TS_OK;
}

static ts_status cpu_reduce_to(ts_tensor *out, const ts_tensor *x, const int64_t *ostr) {
    float *o = ts__f32(out);
    const float *p = ts__f32(x);
    int64_t n = ts_tensor_numel(x), on = ts_tensor_numel(out);
    memset(o, 0, (size_t)on * sizeof(float));
    /* serial in x order with double accumulators would need a buffer; the sizes
     * reduced here (bias gradients, broadcast scalars) are small, so keep it simple */
    int nd = x->ndim;
    if (on == 1) {
        double acc = 0;
        for (int64_t i = 0; i < n; i++) acc += p[i];
        o[0] = (float)acc;
        return TS_OK;
    }
    for (int64_t i = 0; i < n; i++) o[strided_offset(nd, x->shape, ostr, i)] += p[i];
    return TS_OK;
}

static ts_status cpu_sum_all(ts_tensor *out, const ts_tensor *x) {
    const float *p = ts__f32(x);
    int64_t n = ts_tensor_numel(x);
    double acc = 0;
#pragma omp parallel for if (n > PAR_MIN) reduction(+ : acc) schedule(static)
    for (int64_t i = 0; i < n; i++) acc += p[i];
    ts__f32(out)[0] = (float)acc;
    return TS_OK;
}

static ts_status cpu_expand_scalar(ts_tensor *out, const ts_tensor *s, float alpha) {
    return cpu_fill(out, alpha * ts__f32(s)[0]);
}

const struct ts_kernels_ew ts_cpu_kernels_ew = {
    .fill = cpu_fill,
    .copy = cpu_copy,
    .binary = cpu_binary,
    .scale = cpu_scale,
    .axpy = cpu_axpy,
    .relu = cpu_relu,
    .relu_backward = cpu_relu_backward,
    .reduce_to = cpu_reduce_to,
    .sum_all = cpu_sum_all,
    .expand_scalar = cpu_expand_scalar,
};
