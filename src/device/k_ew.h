/*
 * device/k_ew.h — the elementwise kernel family: fills, copies, binary ops with
 * broadcasting, relu and the other activations, reductions (all elements, or
 * one dim at a time), max along a dim, permutes. Every backend provides one
 * instance.
 *
 * Broadcast convention: `out` is contiguous with out->ndim dims; a and b are
 * read at strides astr/bstr (one per out dim, 0 on broadcast dims), starting at
 * their own first element.
 */
#ifndef TS_K_EW_H
#define TS_K_EW_H

#include "device/device.h"

typedef enum ts_binop { TS_BIN_ADD = 0, TS_BIN_SUB, TS_BIN_MUL, TS_BIN_DIV } ts_binop;

/* Unary activations (ops/activation.c). GELU is PyTorch's approximate='none'
 * (x Phi(x), with erf) and approximate='tanh'. */
typedef enum ts_unop { TS_UN_SIGMOID = 0, TS_UN_TANH, TS_UN_GELU, TS_UN_GELU_TANH, TS_UN_SILU } ts_unop;

struct ts_kernels_ew {
    ts_status (*fill)(ts_tensor *out, float v);
    /* out (contiguous) = x (any strides), same shape and dtype */
    ts_status (*copy)(ts_tensor *out, const ts_tensor *x);
    ts_status (*binary)(ts_binop op, ts_tensor *out, const ts_tensor *a, const int64_t *astr, const ts_tensor *b,
                        const int64_t *bstr);
    /* out = s * x (out may alias x) */
    ts_status (*scale)(ts_tensor *out, const ts_tensor *x, float s);
    /* y += alpha * x, same shape, both contiguous */
    ts_status (*axpy)(ts_tensor *y, float alpha, const ts_tensor *x);
    ts_status (*relu)(ts_tensor *out, const ts_tensor *x);
    /* gx = gy where y > 0, else 0 */
    ts_status (*relu_backward)(ts_tensor *gx, const ts_tensor *gy, const ts_tensor *y);
    /* out[j] = sum of x over the elements that map to j: out is x's shape with
     * some dims reduced to 1 (the reverse of broadcasting); ostr gives out's
     * strides over x's dims (0 on reduced dims). */
    ts_status (*reduce_to)(ts_tensor *out, const ts_tensor *x, const int64_t *ostr);
    /* out (one element) = sum of all x */
    ts_status (*sum_all)(ts_tensor *out, const ts_tensor *x);
    /* out = the one-element tensor s broadcast to out's shape, times alpha */
    ts_status (*expand_scalar)(ts_tensor *out, const ts_tensor *s, float alpha);

    /* ---- activations, dim reductions, permute (all tensors contiguous) ----
     * The (outer, n, inner) convention of k_misc.h: a contiguous tensor seen as
     * three dims, the middle one being the dim an op works along. */
    /* out = f(x), same shape */
    ts_status (*unary)(ts_unop op, ts_tensor *out, const ts_tensor *x);
    /* gx = gy * f'(x). Sigmoid and tanh read y (the forward output), GELU and
     * SiLU read x; the one not read may be NULL. */
    ts_status (*unary_backward)(ts_unop op, ts_tensor *gx, const ts_tensor *gy, const ts_tensor *x,
                                const ts_tensor *y);
    /* out: (outer, inner) = alpha * sum over the middle dim of x: (outer, n, inner) */
    ts_status (*sum_dim)(ts_tensor *out, const ts_tensor *x, int64_t outer, int64_t n, int64_t inner, float alpha);
    /* out: (outer, n, inner) = alpha * x: (outer, inner) repeated along the middle dim */
    ts_status (*expand_dim)(ts_tensor *out, const ts_tensor *x, int64_t outer, int64_t n, int64_t inner,
                            float alpha);
    /* x: (outer, n, inner), n >= 1 -> values: (outer, inner) the maximum over the
     * middle dim, indices: (outer, inner) I64 its first position (a NaN wins, as in PyTorch) */
    ts_status (*max_dim)(ts_tensor *values, ts_tensor *indices, const ts_tensor *x, int64_t outer, int64_t n,
                         int64_t inner);
    /* gx: (outer, n, inner) = g: (outer, inner) at the positions in indices, 0 elsewhere */
    ts_status (*max_dim_backward)(ts_tensor *gx, const ts_tensor *g, const ts_tensor *indices, int64_t outer,
                                  int64_t n, int64_t inner);
    /* out = x with its dims permuted: out dim d is x dim perm[d] (any dtype) */
    ts_status (*permute)(ts_tensor *out, const ts_tensor *x, const int *perm);
    /* out = x converted to out's dtype (both contiguous, same shape; F32, F16 or BF16), rounding as
     * core/half.h */
    ts_status (*cast)(ts_tensor *out, const ts_tensor *x);
    /* binary (TS_BIN_ADD of two contiguous BF16 tensors of one shape into a BF16 out), axpy (y and x BF16
     * or F16), relu and relu_backward (all BF16) also take 16-bit tensors, computing each element in float32
     * and rounding it once (bfloat16 activations, ts_set_autocast); where false, the op layer widens to
     * float32 around the float32 kernels */
    bool bf16;
};

/* The CPU backend's instance (src/ops/cpu/ew.c), which device/cpu.c puts in
 * the table of every CPU device. */
extern const struct ts_kernels_ew ts_cpu_kernels_ew;
#ifdef TS_HAVE_CUDA
extern const struct ts_kernels_ew ts_cuda_kernels_ew; /* src/ops/cuda/ew.c */
#endif

#endif
