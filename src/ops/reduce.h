/*
 * ops/reduce.h — the op layer's sum over chosen dims, without autograd, for
 * ops whose backward reduces a broadcast gradient (ops/linalg.c) as well as
 * for ts_sum_dims (ops/reduce.c).
 */
#ifndef TS_OPS_REDUCE_H
#define TS_OPS_REDUCE_H

#include "tensor/tensor.h"

/* out = alpha * x summed over the dims d with reduce[d] (x: any strides, F32);
 * out: contiguous F32 on x's device holding the product of x's kept dims'
 * sizes (any shape: keepdim or not). */
ts_status ts__sum_dims_into(const ts_tensor *x, const bool *reduce, float alpha, ts_tensor *out);

#endif /* TS_OPS_REDUCE_H */
