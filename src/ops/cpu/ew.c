/*
 * ops/cpu/ew.c — elementwise kernels on the CPU (OpenMP over elements).
 * Fast paths for contiguous, same-shape operands; a general strided walk
 * (an odometer over the output's index) for broadcasting and views. The
 * activations, the one-dim reductions and max work on contiguous tensors seen
 * as (outer, n, inner); permute transposes in tiles.
 */
#include "tensor/tensor.h"
#include "core/half.h"
#include "device/k_ew.h"
#include "ops/cpu/vmath.h"
/* the activations' exp, erf and tanh: vmath.h's vectorising ones (before device/k_elem.h) */
#define TS_ELEM_EXPF ts__vexpf
#define TS_ELEM_ERFF ts__verff
#define TS_ELEM_TANHF ts__vtanhf
#include "device/k_elem.h"

#include <math.h>
#include <omp.h>

#define PAR_MIN 32768 /* below this many elements, stay on one thread */

_Static_assert((int)TS_BIN_ADD == TS_ELEM_ADD && (int)TS_BIN_SUB == TS_ELEM_SUB && (int)TS_BIN_MUL == TS_ELEM_MUL &&
                   (int)TS_BIN_DIV == TS_ELEM_DIV,
               "device/k_elem.h's binary op numbers");
_Static_assert((int)TS_UN_SIGMOID == TS_ELEM_SIGMOID && (int)TS_UN_TANH == TS_ELEM_TANH &&
                   (int)TS_UN_GELU == TS_ELEM_GELU && (int)TS_UN_GELU_TANH == TS_ELEM_GELU_TANH &&
                   (int)TS_UN_SILU == TS_ELEM_SILU,
               "device/k_elem.h's unary op numbers");

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

/* ---- bfloat16 activations: row loops in float32, each output rounded once; cloned per ISA (TS_CLONES) so the
 * conversions vectorise ---- */
#define ROWS16 16384 /* elements per OpenMP work item */

TS_CLONES static void add16_row(uint16_t *o, const uint16_t *a, const uint16_t *b, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        o[i] = ts__bf16_from_f32(ts_elem_binary(TS_ELEM_ADD, ts__bf16_to_f32(a[i]), ts__bf16_to_f32(b[i])));
}

TS_CLONES static void relu16_row(uint16_t *o, const uint16_t *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) o[i] = ts__bf16_from_f32(ts_elem_relu(ts__bf16_to_f32(x[i])));
}

TS_CLONES static void relu_bwd16_row(uint16_t *o, const uint16_t *g, const uint16_t *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        const float gi = ts__bf16_to_f32(g[i]), yi = ts__bf16_to_f32(y[i]);
        o[i] = ts__bf16_from_f32(ts_elem_relu_backward(gi, yi));
    }
}

TS_CLONES static void axpy16_row(uint16_t *o, float alpha, const uint16_t *x, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        o[i] = ts__bf16_from_f32(ts_elem_axpy(ts__bf16_to_f32(o[i]), alpha, ts__bf16_to_f32(x[i])));
}

/* binary on bfloat16 a, b and out: the add of two contiguous tensors of one shape (the residual add of
 * bfloat16 activations; ops/elementwise.c sends no other) */
static ts_status binary_bf16(ts_binop op, ts_tensor *out, const ts_tensor *a, const int64_t *astr, const ts_tensor *b,
                             const int64_t *bstr) {
    const int64_t n = ts_tensor_numel(out);
    bool contiguous = true;
    int64_t s = 1;
    for (int d = out->ndim - 1; d >= 0; d--) {
        if (out->shape[d] != 1 && (astr[d] != s || bstr[d] != s)) contiguous = false;
        s *= out->shape[d];
    }
    if (op != TS_BIN_ADD || !contiguous)
        return ts_error(TS_ERR_UNSUPPORTED, "binary on bfloat16: only the add of two contiguous tensors of one shape");
    uint16_t *o = ts__ptr(out);
    const uint16_t *pa = ts__ptr(a), *pb = ts__ptr(b);
#pragma omp parallel for if (n > PAR_MIN) schedule(static)
    for (int64_t i = 0; i < n; i += ROWS16) add16_row(o + i, pa + i, pb + i, TS_MIN(ROWS16, n - i));
    return TS_OK;
}

static ts_status cpu_binary(ts_binop op, ts_tensor *out, const ts_tensor *a, const int64_t *astr, const ts_tensor *b,
                            const int64_t *bstr) {
    if (out->dtype == TS_BF16) return binary_bf16(op, out, a, astr, b, bstr);
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
            for (int64_t i = 0; i < n; i++) o[i] = ts_elem_binary(TS_BIN_ADD, pa[i], pb[i]);
            break;
        case TS_BIN_SUB:
#pragma omp parallel for if (n > PAR_MIN) schedule(static)
            for (int64_t i = 0; i < n; i++) o[i] = ts_elem_binary(TS_BIN_SUB, pa[i], pb[i]);
            break;
        case TS_BIN_MUL:
#pragma omp parallel for if (n > PAR_MIN) schedule(static)
            for (int64_t i = 0; i < n; i++) o[i] = ts_elem_binary(TS_BIN_MUL, pa[i], pb[i]);
            break;
        case TS_BIN_DIV:
#pragma omp parallel for if (n > PAR_MIN) schedule(static)
            for (int64_t i = 0; i < n; i++) o[i] = ts_elem_binary(TS_BIN_DIV, pa[i], pb[i]);
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
        switch (op) { /* one loop per op, so each vectorises */
        case TS_BIN_ADD:
            for (int64_t j = 0; j < inner; j++) ro[j] = ts_elem_binary(TS_BIN_ADD, ra[j * ai], rb[j * bi]);
            break;
        case TS_BIN_SUB:
            for (int64_t j = 0; j < inner; j++) ro[j] = ts_elem_binary(TS_BIN_SUB, ra[j * ai], rb[j * bi]);
            break;
        case TS_BIN_MUL:
            for (int64_t j = 0; j < inner; j++) ro[j] = ts_elem_binary(TS_BIN_MUL, ra[j * ai], rb[j * bi]);
            break;
        case TS_BIN_DIV:
            for (int64_t j = 0; j < inner; j++) ro[j] = ts_elem_binary(TS_BIN_DIV, ra[j * ai], rb[j * bi]);
            break;
        }
    }
    return TS_OK;
}

static ts_status cpu_scale(ts_tensor *out, const ts_tensor *x, float s) {
    float *o = ts__f32(out);
    const float *p = ts__f32(x);
    int64_t n = ts_tensor_numel(out);
#pragma omp parallel for if (n > PAR_MIN) schedule(static)
    for (int64_t i = 0; i < n; i++) o[i] = ts_elem_scale(p[i], s);
    return TS_OK;
}

/* y += alpha x on 16-bit y and x (autograd's sum of two gradients of a 16-bit tensor): in float32, rounded
 * once */
static ts_status axpy_16(ts_tensor *y, float alpha, const ts_tensor *x) {
    uint16_t *o = ts__ptr(y);
    const uint16_t *p = ts__ptr(x);
    int64_t n = ts_tensor_numel(y);
    if (y->dtype == TS_BF16) {
#pragma omp parallel for if (n > PAR_MIN) schedule(static)
        for (int64_t i = 0; i < n; i += ROWS16) axpy16_row(o + i, alpha, p + i, TS_MIN(ROWS16, n - i));
    } else {
#pragma omp parallel for if (n > PAR_MIN) schedule(static)
        for (int64_t i = 0; i < n; i++) o[i] = ts__f16_from_f32(ts_elem_axpy(ts__f16_to_f32(o[i]), alpha, ts__f16_to_f32(p[i])));
    }
    return TS_OK;
}

static ts_status cpu_axpy(ts_tensor *y, float alpha, const ts_tensor *x) {
    if (y->dtype != x->dtype)
        return ts_error(TS_ERR_DTYPE, "axpy: %s += %s", ts_dtype_name(y->dtype), ts_dtype_name(x->dtype));
    if (y->dtype == TS_BF16 || y->dtype == TS_F16) return axpy_16(y, alpha, x);
    float *o = ts__f32(y);
    const float *p = ts__f32(x);
    int64_t n = ts_tensor_numel(y);
    if (alpha == 1.0f) {
#pragma omp parallel for if (n > PAR_MIN) schedule(static)
        for (int64_t i = 0; i < n; i++) o[i] = ts_elem_axpy(o[i], 1.0f, p[i]);
    } else {
#pragma omp parallel for if (n > PAR_MIN) schedule(static)
        for (int64_t i = 0; i < n; i++) o[i] = ts_elem_axpy(o[i], alpha, p[i]);
    }
    return TS_OK;
}

static ts_status cpu_relu(ts_tensor *out, const ts_tensor *x) {
    if (x->dtype == TS_BF16) {
        uint16_t *o = ts__ptr(out);
        const uint16_t *p = ts__ptr(x);
        int64_t n = ts_tensor_numel(out);
#pragma omp parallel for if (n > PAR_MIN) schedule(static)
        for (int64_t i = 0; i < n; i += ROWS16) relu16_row(o + i, p + i, TS_MIN(ROWS16, n - i));
        return TS_OK;
    }
    float *o = ts__f32(out);
    const float *p = ts__f32(x);
    int64_t n = ts_tensor_numel(out);
#pragma omp parallel for if (n > PAR_MIN) schedule(static)
    for (int64_t i = 0; i < n; i++) o[i] = ts_elem_relu(p[i]);
    return TS_OK;
}

static ts_status cpu_relu_backward(ts_tensor *gx, const ts_tensor *gy, const ts_tensor *y) {
    if (gx->dtype == TS_BF16) {
        uint16_t *o = ts__ptr(gx);
        const uint16_t *g = ts__ptr(gy), *p = ts__ptr(y);
        int64_t n = ts_tensor_numel(gx);
#pragma omp parallel for if (n > PAR_MIN) schedule(static)
        for (int64_t i = 0; i < n; i += ROWS16) relu_bwd16_row(o + i, g + i, p + i, TS_MIN(ROWS16, n - i));
        return TS_OK;
    }
    float *o = ts__f32(gx);
    const float *g = ts__f32(gy), *p = ts__f32(y);
    int64_t n = ts_tensor_numel(gx);
#pragma omp parallel for if (n > PAR_MIN) schedule(static)
    for (int64_t i = 0; i < n; i++) { /* both loads unconditional: a select, not a branch, without masked loads */
        const float gi = g[i], yi = p[i];
        o[i] = ts_elem_relu_backward(gi, yi);
    }
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

/* ---- activations (formulas: device/k_elem.h) ------------------------------------------------------------ */
/* The activations run in spans of ACT_SPAN elements, each span a call of a function cloned per CPU width
 * (TS_CLONES: AVX-512, AVX2, the baseline) holding one loop per op with a constant op, so the formula
 * (vmath.h's polynomials) inlines and vectorises at the CPU's width; spans are parallel above `lim`. */
#define ACT_SPAN 4096

#define UNARY_SPAN(OP)                                                  \
    case OP:                                                            \
        for (int64_t i = 0; i < n; i++) o[i] = ts_elem_unary(OP, p[i]); \
        break

TS_CLONES static void unary_span(ts_unop op, float *o, const float *p, int64_t n) {
    switch (op) {
        UNARY_SPAN(TS_UN_SIGMOID);
        UNARY_SPAN(TS_UN_TANH);
        UNARY_SPAN(TS_UN_GELU);
        UNARY_SPAN(TS_UN_GELU_TANH);
        UNARY_SPAN(TS_UN_SILU);
    }
}

static ts_status cpu_unary(ts_unop op, ts_tensor *out, const ts_tensor *x) {
    float *o = ts__f32(out);
    const float *p = ts__f32(x);
    const int64_t n = ts_tensor_numel(out), spans = (n + ACT_SPAN - 1) / ACT_SPAN;
    const int64_t lim = PAR_MIN / 8; /* exp, erf, tanh: costly elements */
#pragma omp parallel for if (n > lim) schedule(static)
    for (int64_t s = 0; s < spans; s++)
        unary_span(op, o + s * ACT_SPAN, p + s * ACT_SPAN, TS_MIN((int64_t)ACT_SPAN, n - s * ACT_SPAN));
    return TS_OK;
}

/* v: y for sigmoid and tanh, x for the others */
#define UNARY_BACKWARD_SPAN(OP)                                                           \
    case OP:                                                                              \
        for (int64_t i = 0; i < n; i++) o[i] = ts_elem_unary_backward(OP, g[i], v[i]);   \
        break

TS_CLONES static void unary_backward_span(ts_unop op, float *o, const float *g,
                                          const float *v, int64_t n) {
    switch (op) {
        UNARY_BACKWARD_SPAN(TS_UN_SIGMOID);
        UNARY_BACKWARD_SPAN(TS_UN_TANH);
        UNARY_BACKWARD_SPAN(TS_UN_GELU);
        UNARY_BACKWARD_SPAN(TS_UN_GELU_TANH);
        UNARY_BACKWARD_SPAN(TS_UN_SILU);
    }
}

static ts_status cpu_unary_backward(ts_unop op, ts_tensor *gx, const ts_tensor *gy, const ts_tensor *x,
                                    const ts_tensor *y) {
    bool from_y = op == TS_UN_SIGMOID || op == TS_UN_TANH;
    float *o = ts__f32(gx);
    const float *g = ts__f32(gy), *v = ts__f32(from_y ? y : x);
    const int64_t n = ts_tensor_numel(gx), spans = (n + ACT_SPAN - 1) / ACT_SPAN;
    const int64_t lim = from_y ? PAR_MIN : PAR_MIN / 8; /* the x ones call exp, erf or tanh */
#pragma omp parallel for if (n > lim) schedule(static)
    for (int64_t s = 0; s < spans; s++) {
        const int64_t k = s * ACT_SPAN;
        unary_backward_span(op, o + k, g + k, v + k, TS_MIN((int64_t)ACT_SPAN, n - k));
    }
    return TS_OK;
}

/* ---- reductions along one dim ---------------------------------------------------------------------- */
// out: (outer, inner) = alpha * sum_k x: (outer, n, inner)[:, k, :]
static ts_status cpu_sum_dim(ts_tensor *out, const ts_tensor *x, int64_t outer, int64_t n, int64_t inner,
                             float alpha) {
    float *o = ts__f32(out);
    const float *p = ts__f32(x);
    if (inner == 1) { /* contiguous rows: float partial sums in SIMD lanes (each adds n/16 terms or fewer),
                         rows longer than a block also totalled in double across blocks */
        const int64_t block = 4096;
#pragma omp parallel for if (outer * n > PAR_MIN) schedule(static)
        for (int64_t r = 0; r < outer; r++) {
            const float *row = p + r * n;
            double acc = 0;
            for (int64_t k0 = 0; k0 < n; k0 += block) {
                int64_t k1 = TS_MIN(n, k0 + block);
                float part = 0.0f;
#pragma omp simd reduction(+ : part)
                for (int64_t k = k0; k < k1; k++) part += row[k];
                acc += part;
            }
            o[r] = (float)(alpha * acc);
        }
        return TS_OK;
    }
    /* rows of inner elements added into the output row (vectorises along inner);
     * split the outer dim, or the inner one when outer is too short to share */
    int nthr = omp_get_max_threads();
    if (outer >= nthr || outer * n * inner <= PAR_MIN) {
#pragma omp parallel for if (outer * n * inner > PAR_MIN) schedule(static)
        for (int64_t r = 0; r < outer; r++) {
            float *orow = o + r * inner;
            const float *xr = p + r * n * inner;
            memset(orow, 0, sizeof(float) * (size_t)inner);
            for (int64_t k = 0; k < n; k++)
                for (int64_t i = 0; i < inner; i++) orow[i] += xr[k * inner + i];
            if (alpha != 1.0f)
                for (int64_t i = 0; i < inner; i++) orow[i] *= alpha;
        }
        return TS_OK;
    }
    const int64_t chunk = 1024;
    const int64_t nchunks = (inner + chunk - 1) / chunk;
#pragma omp parallel for collapse(2) schedule(static)
    for (int64_t r = 0; r < outer; r++)
        for (int64_t c = 0; c < nchunks; c++) {
            int64_t lo = c * chunk, hi = TS_MIN(inner, lo + chunk);
            float *orow = o + r * inner;
            const float *xr = p + r * n * inner;
            for (int64_t i = lo; i < hi; i++) orow[i] = 0.0f;
            for (int64_t k = 0; k < n; k++)
                for (int64_t i = lo; i < hi; i++) orow[i] += xr[k * inner + i];
            if (alpha != 1.0f)
                for (int64_t i = lo; i < hi; i++) orow[i] *= alpha;
        }
    return TS_OK;
}

// out: (outer, n, inner) = alpha * x: (outer, inner) along the middle dim
static ts_status cpu_expand_dim(ts_tensor *out, const ts_tensor *x, int64_t outer, int64_t n, int64_t inner,
                                float alpha) {
    float *o = ts__f32(out);
    const float *p = ts__f32(x);
    int64_t rows = outer * n;
    if (inner == 1) {
#pragma omp parallel for if (rows > PAR_MIN) schedule(static)
        for (int64_t r = 0; r < outer; r++) {
            float v = alpha * p[r];
            for (int64_t k = 0; k < n; k++) o[r * n + k] = v;
        }
        return TS_OK;
    }
#pragma omp parallel for if (rows * inner > PAR_MIN) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        const float *src = p + (r / n) * inner; /* one division per row of inner elements */
        float *dst = o + r * inner;
        for (int64_t i = 0; i < inner; i++) dst[i] = alpha * src[i];
    }
    return TS_OK;
}

// values, indices: (outer, inner) = max / first argmax over the middle dim of x: (outer, n, inner)
static ts_status cpu_max_dim(ts_tensor *values, ts_tensor *indices, const ts_tensor *x, int64_t outer, int64_t n,
                             int64_t inner) {
    float *ov = ts__f32(values);
    int64_t *oi = (int64_t *)ts__ptr(indices);
    const float *p = ts__f32(x);
    if (inner == 1) { /* a vector max (and NaN check) over the row, then its first position */
#pragma omp parallel for if (outer * n > PAR_MIN) schedule(static)
        for (int64_t r = 0; r < outer; r++) {
            const float *row = p + r * n;
            float best = row[0];
            int nan = 0;
#pragma omp simd reduction(max : best) reduction(| : nan)
            for (int64_t k = 0; k < n; k++) {
                best = row[k] > best ? row[k] : best;
                nan |= row[k] != row[k];
            }
            int64_t bi = 0;
            if (nan)
                while (row[bi] == row[bi]) bi++;
            else
                while (row[bi] != best) bi++;
            ov[r] = row[bi];
            oi[r] = bi;
        }
        return TS_OK;
    }
    /* compare whole rows of inner elements against the running maximum row */
#pragma omp parallel for if (outer * n * inner > PAR_MIN) schedule(static)
    for (int64_t r = 0; r < outer; r++) {
        const float *xr = p + r * n * inner;
        float *vr = ov + r * inner;
        int64_t *ir = oi + r * inner;
        for (int64_t i = 0; i < inner; i++) {
            vr[i] = xr[i];
            ir[i] = 0;
        }
        for (int64_t k = 1; k < n; k++) {
            const float *xk = xr + k * inner;
            for (int64_t i = 0; i < inner; i++)
                if (ts_elem_max_wins(xk[i], vr[i])) {
                    vr[i] = xk[i];
                    ir[i] = k;
                }
        }
    }
    return TS_OK;
}

// gx: (outer, n, inner) = g: (outer, inner) scattered at indices along the middle dim
static ts_status cpu_max_dim_backward(ts_tensor *gx, const ts_tensor *g, const ts_tensor *indices, int64_t outer,
                                      int64_t n, int64_t inner) {
    float *o = ts__f32(gx);
    const float *pg = ts__f32(g);
    const int64_t *pi = (const int64_t *)ts__ptr(indices);
#pragma omp parallel for if (outer * n * inner > PAR_MIN) schedule(static)
    for (int64_t r = 0; r < outer; r++) {
        float *xr = o + r * n * inner;
        memset(xr, 0, sizeof(float) * (size_t)(n * inner));
        for (int64_t i = 0; i < inner; i++) xr[pi[r * inner + i] * inner + i] = pg[r * inner + i];
    }
    return TS_OK;
}

/* ---- permute ---------------------------------------------------------------------------------------- */
#define PERMUTE_TILE 32

/* out (contiguous) = x (contiguous) with dims permuted. The source strides are
 * first seen in out's order, size-1 dims dropped and dims that stay adjacent
 * merged. Then either the last dim still reads contiguously (copy rows of it)
 * or it does not, and the dim that reads contiguously, j, is elsewhere: every
 * index of the other dims is a 2-D transpose of (size[j], size[last]), copied
 * in 32x32 tiles so both sides stay in cache. */
static ts_status cpu_permute(ts_tensor *out, const ts_tensor *x, const int *perm) {
    size_t es = ts_dtype_size(x->dtype);
    int64_t n = ts_tensor_numel(out);
    if (n == 0) return TS_OK;
    int64_t shape[TS_MAX_DIMS], sstr[TS_MAX_DIMS];
    int nd = 0;
    for (int d = 0; d < out->ndim; d++) {
        int64_t sz = out->shape[d], st = x->stride[perm[d]];
        if (sz == 1) continue;
        if (nd > 0 && sstr[nd - 1] == st * sz) { /* merges with the previous dim */
            shape[nd - 1] *= sz;
            sstr[nd - 1] = st;
        } else {
            shape[nd] = sz;
            sstr[nd] = st;
            nd++;
        }
    }
    const char *src = ts__ptr(x);
    char *dst = ts__ptr(out);
    if (nd == 0 || sstr[nd - 1] == 1) { /* rows of the last dim are contiguous on both sides */
        int64_t inner = nd ? shape[nd - 1] : 1, rows = n / inner;
        size_t rb = (size_t)inner * es;
#pragma omp parallel for if (n > PAR_MIN) schedule(static)
        for (int64_t r = 0; r < rows; r++)
            memcpy(dst + (size_t)r * rb, src + (size_t)strided_offset(nd - 1, shape, sstr, r) * es, rb);
        return TS_OK;
    }
    int j = 0; /* x is contiguous, so some dim reads with stride 1 */
    while (j < nd && sstr[j] != 1) j++;
    if (j == nd) return ts_error(TS_ERR_INTERNAL, "permute: input is not contiguous");
    /* out strides of the coalesced dims */
    int64_t ostr[TS_MAX_DIMS], s = 1;
    for (int d = nd - 1; d >= 0; d--) {
        ostr[d] = s;
        s *= shape[d];
    }
    /* the other dims, as one odometer */
    int64_t oshape[TS_MAX_DIMS], osrc[TS_MAX_DIMS], odst[TS_MAX_DIMS];
    int no = 0;
    for (int d = 0; d < nd - 1; d++)
        if (d != j) {
            oshape[no] = shape[d];
            osrc[no] = sstr[d];
            odst[no] = ostr[d];
            no++;
        }
    const int64_t R = shape[j], C = shape[nd - 1], rs = ostr[j], cs = sstr[nd - 1];
    const int64_t tr = (R + PERMUTE_TILE - 1) / PERMUTE_TILE, tc = (C + PERMUTE_TILE - 1) / PERMUTE_TILE;
    const int64_t nb = n / (R * C), tasks = nb * tr * tc;
#pragma omp parallel for if (n > PAR_MIN) schedule(static)
    for (int64_t t = 0; t < tasks; t++) {
        int64_t b = t / (tr * tc), rem = t - b * (tr * tc), ti = rem / tc, tj = rem - ti * tc;
        int64_t so = strided_offset(no, oshape, osrc, b), dof = strided_offset(no, oshape, odst, b);
        int64_t r0 = ti * PERMUTE_TILE, r1 = TS_MIN(R, r0 + PERMUTE_TILE);
        int64_t c0 = tj * PERMUTE_TILE, c1 = TS_MIN(C, c0 + PERMUTE_TILE);
        /* out[.., r, .., c] (stride rs, 1) = x[.., r (stride 1), .., c (stride cs)] */
        if (es == 4) {
            const float *sp = (const float *)src + so;
            float *dp = (float *)dst + dof;
            for (int64_t r = r0; r < r1; r++)
                for (int64_t c = c0; c < c1; c++) dp[r * rs + c] = sp[r + c * cs];
        } else {
            for (int64_t r = r0; r < r1; r++)
                for (int64_t c = c0; c < c1; c++)
                    memcpy(dst + (size_t)(dof + r * rs + c) * es, src + (size_t)(so + r + c * cs) * es, es);
        }
    }
    return TS_OK;
}

/* out, x: contiguous, same numel; chunks of CAST_CHUNK elements over the threads */
#define CAST_CHUNK 16384
static ts_status cpu_cast(ts_tensor *out, const ts_tensor *x) {
    int64_t n = ts_tensor_numel(x), chunks = (n + CAST_CHUNK - 1) / CAST_CHUNK;
    size_t so = ts_dtype_size(out->dtype), sx = ts_dtype_size(x->dtype);
    unsigned char *po = ts__ptr(out);
    const unsigned char *px = ts__ptr(x);
    int bad = 0;
#pragma omp parallel for if (chunks > 1) schedule(static) reduction(| : bad)
    for (int64_t c = 0; c < chunks; c++) {
        int64_t i = c * CAST_CHUNK, m = n - i < CAST_CHUNK ? n - i : CAST_CHUNK;
        bad |= ts_convert(po + (size_t)i * so, out->dtype, px + (size_t)i * sx, x->dtype, (size_t)m) != TS_OK;
    }
    return bad ? ts_error(TS_ERR_DTYPE, "cast: %s to %s", ts_dtype_name(x->dtype), ts_dtype_name(out->dtype)) : TS_OK;
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
    .unary = cpu_unary,
    .unary_backward = cpu_unary_backward,
    .sum_dim = cpu_sum_dim,
    .expand_dim = cpu_expand_dim,
    .max_dim = cpu_max_dim,
    .max_dim_backward = cpu_max_dim_backward,
    .permute = cpu_permute,
    .cast = cpu_cast,
    .bf16 = true,
};
