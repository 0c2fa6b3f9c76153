/*
 * device/k_ew.h — the elementwise kernel family: fills, copies, binary ops with
 * broadcasting, relu, reductions. Every backend provides one instance.
 *
 * Broadcast convention: `out` is contiguous with out->ndim dims; a and b are
 * read at strides astr/bstr (one per out dim, 0 on broadcast dims), starting at
 * their own first element.
 */
#ifndef TS_K_EW_H
#define TS_K_EW_H

#include "device/device.h"

typedef enum ts_binop { TS_BIN_ADD = 0, TS_BIN_SUB, TS_BIN_MUL } ts_binop;

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
};

/* The CPU backend's instance (src/ops/cpu/ew.c), which device/cpu.c puts in
 * the table of every CPU device. */
extern const struct ts_kernels_ew ts_cpu_kernels_ew;

#endif
