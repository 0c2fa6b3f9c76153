/*
 * ops/cuda/spatial_cu.h — launchers of the CUDA spatial kernels (src/ops/cuda/spatial.cu), called by
 * the kernel table in src/ops/cuda/spatial.c. Raw device pointers, NCHW contiguous F32 (pool indices
 * I32); each launcher queues its kernel(s) on `s` and returns cudaGetLastError().
 *
 * Convolutions themselves go to cuDNN (spatial.c); what is here is pooling, batchnorm and the small
 * per-channel helpers of conv2d (bias add, bias gradient).
 *
 * dt (TS_CU_F32 or TS_CU_BF16, ew_cu.h) is the type of the activations a launcher reads and writes (x, out,
 * gout, gx, g; void pointers): bfloat16 under ts_set_autocast, each element computed in float32 and rounded
 * once. Statistics, weights, biases, coefficients and their gradients are float32 always.
 *
 * Per-channel reductions (batchnorm statistics and gradients, the conv bias gradient) are
 * deterministic: ts_cu_chan_partials splits each channel's N*HW elements into S contiguous ranges
 * (S from ts_cu_chan_splits, a function of the shape only), one block per (channel, range); each
 * thread adds its strided elements in double, the block adds its threads' sums with a fixed-order
 * shared-memory tree, and the finalize kernels add a channel's S partials in order 0..S-1.
 */
#ifndef TS_OPS_CUDA_SPATIAL_CU_H
#define TS_OPS_CUDA_SPATIAL_CU_H

#include "ops/cuda/cu.h"
#include "ops/cuda/ew_cu.h"

/* Pooling geometry (the fields of ts_pool2d_geom, device/k_spatial.h, which .cu files do not see). */
typedef struct ts_cu_pool_geom {
    int64_t N, C, H, W, OH, OW;
    int kh, kw, sh, sw, ph, pw, dh, dw;
    bool exclude_pad;
} ts_cu_pool_geom;

/* What ts_cu_chan_partials adds per element of channel c (m = mean[c]). */
enum {
    TS_CU_CHAN_SUM = 0,   /* a += x */
    TS_CU_CHAN_SQDEV = 1, /* a += (x - m)^2 */
    TS_CU_CHAN_DOTDEV = 2 /* a += g, b += g (x - m) */
};

// y: (N, K, HW) += b[k]
TS_CU_EXTERN_C cudaError_t ts_cu_bias_add(int dt, void *y, const float *b, int64_t N, int64_t K, int64_t HW,
                                          cudaStream_t s);

/* ---- pooling ---- */
// out, idx: (N, C, OH, OW) = max (and its flat h*W + w) over each window of x: (N, C, H, W)
TS_CU_EXTERN_C cudaError_t ts_cu_maxpool2d(int dt, const ts_cu_pool_geom *g, void *out, int32_t *idx, const void *x,
                                           cudaStream_t s);
// gx: (N, C, H, W) = sum of the gout: (N, C, OH, OW) whose idx points at each element (a gather)
TS_CU_EXTERN_C cudaError_t ts_cu_maxpool2d_backward(int dt, const ts_cu_pool_geom *g, void *gx, const void *gout,
                                                    const int32_t *idx, cudaStream_t s);
// out: (N, C, OH, OW) = window means of x: (N, C, H, W)
TS_CU_EXTERN_C cudaError_t ts_cu_avgpool2d(const ts_cu_pool_geom *g, float *out, const float *x, cudaStream_t s);
// gx: (N, C, H, W) = sum over the windows covering each element of gout / divisor (a gather)
TS_CU_EXTERN_C cudaError_t ts_cu_avgpool2d_backward(const ts_cu_pool_geom *g, float *gx, const float *gout,
                                                    cudaStream_t s);
// out: (P, OH, OW) = adaptive window means of x: (P, H, W)
TS_CU_EXTERN_C cudaError_t ts_cu_adaptive_avgpool2d(float *out, const float *x, int64_t P, int64_t H, int64_t W,
                                                    int64_t OH, int64_t OW, cudaStream_t s);
// gx: (P, H, W) = sum over the adaptive windows covering each element of gout / window size (a gather)
TS_CU_EXTERN_C cudaError_t ts_cu_adaptive_avgpool2d_backward(float *gx, const float *gout, int64_t P, int64_t H,
                                                             int64_t W, int64_t OH, int64_t OW, cudaStream_t s);

/* ---- per-channel reductions ---- */
/* Ranges per channel for ts_cu_chan_partials (1..65535; depends on the shape only). */
TS_CU_EXTERN_C int ts_cu_chan_splits(int64_t N, int64_t C, int64_t HW);
// part: (C, S, 2) doubles <- per (channel, range) sums of x (and g): (N, C, HW) as `mode` says; mean: (C)
// (read by SQDEV and DOTDEV only, else may be NULL), g: NULL except for DOTDEV
TS_CU_EXTERN_C cudaError_t ts_cu_chan_partials(int mode, int dt, const void *x, const void *g, const float *mean,
                                               int64_t N, int64_t C, int64_t HW, int S, double *part, cudaStream_t s);
// out: (C) = (float) sum of part: (C, S, 2)'s first components (the conv bias gradient)
TS_CU_EXTERN_C cudaError_t ts_cu_chan_sum_finalize(const double *part, int64_t C, int S, float *out, cudaStream_t s);

/* ---- batchnorm2d ---- */
// after SUM partials over M = N*HW elements per channel: mu: (C) doubles, mean: (C) = (float) mu,
// mres (C) (NULL: not written) = (float) (mu - mean)
TS_CU_EXTERN_C cudaError_t ts_cu_bn_stats_mean(const double *part, int64_t C, int S, int64_t M, double *mu,
                                               float *mean, float *mres, cudaStream_t s);
// after SQDEV partials about mean: invstd (C) and, when given, running_mean / running_var (C) updated
TS_CU_EXTERN_C cudaError_t ts_cu_bn_stats_var(const double *part, int64_t C, int S, int64_t M, const double *mu,
                                              const float *mean, float eps, float momentum, float *invstd,
                                              float *running_mean, float *running_var, cudaStream_t s);
// invstd: (C) = 1 / sqrt(var + eps) in double
TS_CU_EXTERN_C cudaError_t ts_cu_bn_invstd(const float *var, float eps, float *invstd, int64_t C, cudaStream_t s);
// out: (N, C, HW) = (x - mean[c] - mres[c]) * invstd[c] * weight[c] + bias[c]; mres, weight, bias may be
// NULL; out may alias x
TS_CU_EXTERN_C cudaError_t ts_cu_bn_apply(int dt, void *out, const void *x, const float *mean, const float *mres,
                                          const float *invstd, const float *weight, const float *bias, int64_t N,
                                          int64_t C, int64_t HW, cudaStream_t s);
// part: (C, S, 2) DOTDEV partials about mean (NULL when no sums were needed) -> gw, gb (C) when not NULL
// and coef: (C, 3) floats (a, b, k) with gx = a g + b (x - mean) + k, centred on mean + mres; mres, weight
// may be NULL
TS_CU_EXTERN_C cudaError_t ts_cu_bn_backward_coef(const double *part, int64_t C, int S, int64_t M, const float *mres,
                                                  const float *invstd, const float *weight, bool training, float *gw,
                                                  float *gb, float *coef, cudaStream_t s);
// gx: (N, C, HW) = coef[c].a * g + coef[c].b * (x - mean[c]) + coef[c].k
TS_CU_EXTERN_C cudaError_t ts_cu_bn_axpbyc(int dt, void *gx, const void *g, const void *x, const float *mean,
                                           const float *coef, int64_t N, int64_t C, int64_t HW, cudaStream_t s);

#endif
