/*
 * ops/cuda/ew_cu.h — launchers of the elementwise family's CUDA kernels (ops/cuda/ew.cu), called by
 * its kernel table (ops/cuda/ew.c) and, for grad_sumsq, by ops/cuda/optim.c. Raw device pointers,
 * sizes in elements, the stream; each returns the launch's cudaError_t. Ops are numbered as in
 * device/k_elem.h (= ts_binop, ts_unop).
 *
 * Reductions are deterministic: a fixed split of the work and a fixed shuffle tree, decided by the
 * shape alone, never atomics.
 */
#ifndef TS_OPS_CUDA_EW_CU_H
#define TS_OPS_CUDA_EW_CU_H

#include "ops/cuda/cu.h"

#define TS_CU_MAX_DIMS 8 /* = TS_MAX_DIMS (checked in ew.c) */

/* An index space of up to TS_CU_MAX_DIMS dims, walked in row-major order, with two sets of
 * strides (in elements) giving two offsets per index: a and b. */
typedef struct ts_cu_walk {
    int ndim;
    int64_t shape[TS_CU_MAX_DIMS];
    int64_t a[TS_CU_MAX_DIMS], b[TS_CU_MAX_DIMS];
} ts_cu_walk;

/* Float element types of cast */
enum { TS_CU_F32 = 0, TS_CU_F16 = 1, TS_CU_BF16 = 2 };

TS_CU_EXTERN_C cudaError_t ts_cu_fill(float *o, int64_t n, float v, cudaStream_t s);
/* o[i] = alpha * x[0] for n elements (x read on the device) */
TS_CU_EXTERN_C cudaError_t ts_cu_expand_scalar(float *o, int64_t n, const float *x, float alpha, cudaStream_t s);
/* bytes from src to dst, both on the device */
TS_CU_EXTERN_C cudaError_t ts_cu_memcpy(void *dst, const void *src, size_t bytes, cudaStream_t s);
/* dst[w.a offset of i] = src[w.b offset of i] for every index i of w; es: 1, 2, 4 or 8 bytes */
TS_CU_EXTERN_C cudaError_t ts_cu_strided_copy(void *dst, const void *src, int es, const ts_cu_walk *w,
                                              cudaStream_t s);
/* o[i] = a[i] op b[i] for n elements (w NULL: all contiguous), or o[i] = a[w.a offset] op
 * b[w.b offset] over w's index space (o contiguous) */
TS_CU_EXTERN_C cudaError_t ts_cu_binary(int op, float *o, const float *a, const float *b, int64_t n,
                                        const ts_cu_walk *w, cudaStream_t s);
TS_CU_EXTERN_C cudaError_t ts_cu_scale(float *o, const float *x, float v, int64_t n, cudaStream_t s);
TS_CU_EXTERN_C cudaError_t ts_cu_axpy(float *y, float alpha, const float *x, int64_t n, cudaStream_t s);
TS_CU_EXTERN_C cudaError_t ts_cu_relu(float *o, const float *x, int64_t n, cudaStream_t s);
TS_CU_EXTERN_C cudaError_t ts_cu_relu_backward(float *gx, const float *gy, const float *y, int64_t n,
                                               cudaStream_t s);
/* bfloat16 activations (ts_set_autocast; the CPU's ew.c does the same): o = a + b of two contiguous bfloat16
 * tensors; y += alpha x on 16-bit y and x of type dt (TS_CU_BF16 or TS_CU_F16: autograd's gradient sums);
 * relu and its backward on bfloat16. Each element computed in float32 and rounded once. */
TS_CU_EXTERN_C cudaError_t ts_cu_add_bf16(uint16_t *o, const uint16_t *a, const uint16_t *b, int64_t n,
                                          cudaStream_t s);
TS_CU_EXTERN_C cudaError_t ts_cu_axpy16(int dt, void *y, float alpha, const void *x, int64_t n, cudaStream_t s);
TS_CU_EXTERN_C cudaError_t ts_cu_relu_bf16(uint16_t *o, const uint16_t *x, int64_t n, cudaStream_t s);
TS_CU_EXTERN_C cudaError_t ts_cu_relu_backward_bf16(uint16_t *gx, const uint16_t *gy, const uint16_t *y, int64_t n,
                                                    cudaStream_t s);
/* o = f(x); gx = gy f'(v) with v = y (sigmoid, tanh) or x (the others) */
TS_CU_EXTERN_C cudaError_t ts_cu_unary(int op, float *o, const float *x, int64_t n, cudaStream_t s);
TS_CU_EXTERN_C cudaError_t ts_cu_unary_backward(int op, float *gx, const float *gy, const float *v, int64_t n,
                                                cudaStream_t s);

/* Row sums, accumulated in double: x: (rows, n) contiguous -> out: (rows) = (float)(alpha * sum).
 * Needs ts_cu_rowsum_scratch(rows, n) bytes of device scratch (0: none, scratch may be NULL). */
TS_CU_EXTERN_C size_t ts_cu_rowsum_scratch(int64_t rows, int64_t n);
TS_CU_EXTERN_C cudaError_t ts_cu_rowsum(float *out, const float *x, int64_t rows, int64_t n, float alpha,
                                        void *scratch, cudaStream_t s);
/* *out (device) = the sum of x's squares in double; scratch: ts_cu_rowsum_scratch(1, n) bytes */
TS_CU_EXTERN_C cudaError_t ts_cu_sumsq(double *out, const float *x, int64_t n, void *scratch, cudaStream_t s);
/* Column sums in float: x: (outer, n, inner), inner > 1 -> out: (outer, inner) = alpha * sum over n */
TS_CU_EXTERN_C cudaError_t ts_cu_colsum(float *out, const float *x, int64_t outer, int64_t n, int64_t inner,
                                        float alpha, cudaStream_t s);
/* Sums of x into out (on elements), in float: for each index j of kept (on in all), out at kept's
 * b offset of j = the sum over every index k of red (m in all) of x at kept's a offset of j plus
 * red's a offset of k, k in order. */
TS_CU_EXTERN_C cudaError_t ts_cu_reduce_to(float *out, const float *x, int64_t on, const ts_cu_walk *kept,
                                           int64_t m, const ts_cu_walk *red, cudaStream_t s);
/* x: (outer, inner) -> out: (outer, n, inner) = alpha x, repeated along the middle dim */
TS_CU_EXTERN_C cudaError_t ts_cu_expand_dim(float *out, const float *x, int64_t outer, int64_t n, int64_t inner,
                                            float alpha, cudaStream_t s);
/* x: (outer, n, inner), n >= 1 -> v, idx: (outer, inner): max and its first position (NaN wins) */
TS_CU_EXTERN_C cudaError_t ts_cu_max_dim(float *v, int64_t *idx, const float *x, int64_t outer, int64_t n,
                                         int64_t inner, cudaStream_t s);
/* gx: (outer, n, inner) = g: (outer, inner) at the positions idx, 0 elsewhere */
TS_CU_EXTERN_C cudaError_t ts_cu_max_dim_backward(float *gx, const float *g, const int64_t *idx, int64_t outer,
                                                  int64_t n, int64_t inner, cudaStream_t s);
/* o (type to) = x (type from), n elements, different TS_CU_* types, rounding as core/half.h */
TS_CU_EXTERN_C cudaError_t ts_cu_cast(void *o, int to, const void *x, int from, int64_t n, cudaStream_t s);

#endif
