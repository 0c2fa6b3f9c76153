/*
 * ops/cuda/norm_cu.h — launchers of the norm family's CUDA kernels (ops/cuda/norm.cu), called by
 * its kernel table (ops/cuda/norm.c). Geometry as in device/k_norm.h: R rows of D = Cg * S
 * elements, row r's channels (r % G) * Cg + c, P = G * Cg affine entries.
 */
#ifndef TS_OPS_CUDA_NORM_CU_H
#define TS_OPS_CUDA_NORM_CU_H

#include "ops/cuda/cu.h"

#define TS_CU_NORM_CHUNK 32 /* rows per partial sum of the weight gradient when S == 1 */

/* out, x: (R, D); mean, mres (or NULL: not written), invstd: (R); w, b: (P) or NULL. */
TS_CU_EXTERN_C cudaError_t ts_cu_group_norm(float *out, float *mean, float *mres, float *invstd, const float *x,
                                            const float *w, const float *b, int64_t R, int64_t G, int64_t Cg,
                                            int64_t S, float eps, cudaStream_t s);

/* Pairs of doubles of scratch that ts_cu_group_norm_backward needs for gw/gb: a partial per
 * (chunk of TS_CU_NORM_CHUNK samples, channel) when S == 1, per (sample, channel) otherwise. */
static inline int64_t ts_cu_group_norm_parts(int64_t R, int64_t G, int64_t Cg, int64_t S) {
    int64_t N = G ? R / G : 0;
    return (S == 1 ? (N + TS_CU_NORM_CHUNK - 1) / TS_CU_NORM_CHUNK : N) * G * Cg;
}

/* gx (R, D), gw, gb (P): any may be NULL; part: ts_cu_group_norm_parts pairs of doubles when gw or
 * gb is given. g, x: (R, D); mean, mres (or NULL: 0), invstd: (R); w: (P) or NULL. */
TS_CU_EXTERN_C cudaError_t ts_cu_group_norm_backward(float *gx, float *gw, float *gb, const float *g, const float *x,
                                                     const float *mean, const float *mres, const float *invstd,
                                                     const float *w, int64_t R, int64_t G, int64_t Cg, int64_t S,
                                                     double *part, cudaStream_t s);

#endif
