/*
 * device/k_spatial.h — the spatial kernel family: conv2d, max/avg pooling,
 * global and adaptive average pooling and batchnorm2d, forward and backward. Every backend
 * provides one instance (src/ops/cpu/spatial.c for the CPU).
 *
 * The op layer (src/ops/conv.c, pool.c, norm.c) checks arguments, computes the
 * geometry below, allocates contiguous results on the inputs' device and calls
 * these kernels. All tensors passed to kernels are contiguous F32 (pool
 * indices: I32) and NCHW, or BF16 activations where the table's bf16 says
 * so. Kernels may allocate scratch through ts__new on the tensors' device.
 */
#ifndef TS_K_SPATIAL_H
#define TS_K_SPATIAL_H

#include "device/device.h"

/* Geometry of one conv2d call: x (N, C, H, W), w (K, C/groups, kh, kw),
 * out (N, K, OH, OW). */
typedef struct ts_conv2d_geom {
    int64_t N, C, H, W;
    int64_t K, OH, OW;
    int kh, kw;
    int sh, sw; /* stride */
    int ph, pw; /* zero padding */
    int dh, dw; /* dilation */
    int groups;
} ts_conv2d_geom;

/* Geometry of one pooling call: x (N, C, H, W) -> out (N, C, OH, OW). */
typedef struct ts_pool2d_geom {
    int64_t N, C, H, W;
    int64_t OH, OW;
    int kh, kw, sh, sw, ph, pw, dh, dw;
    bool exclude_pad; /* avg pool: divide by the input elements in the window (count_include_pad off) */
} ts_pool2d_geom;

struct ts_kernels_spatial {
    /* out: (N, K, OH, OW) = conv(x: (N, C, H, W), w: (K, C/g, kh, kw)) + b: (K) or NULL */
    ts_status (*conv2d)(const ts_conv2d_geom *g, ts_tensor *out, const ts_tensor *x, const ts_tensor *w,
                        const ts_tensor *b);
    /* Gradients of conv2d given gout: (N, K, OH, OW). Each of gx (like x), gw (like w),
     * gb (K) may be NULL (not wanted); those given are overwritten. */
    ts_status (*conv2d_backward)(const ts_conv2d_geom *g, const ts_tensor *gout, const ts_tensor *x,
                                 const ts_tensor *w, ts_tensor *gx, ts_tensor *gw, ts_tensor *gb);

    /* out: (N, C, OH, OW) max over each window (padding never wins);
     * idx: (N, C, OH, OW) I32, flat index h*W + w of the max within its input plane */
    ts_status (*maxpool2d)(const ts_pool2d_geom *g, ts_tensor *out, ts_tensor *idx, const ts_tensor *x);
    /* gx: (N, C, H, W) = scatter-add of gout at idx */
    ts_status (*maxpool2d_backward)(const ts_pool2d_geom *g, ts_tensor *gx, const ts_tensor *gout,
                                    const ts_tensor *idx);
    /* out: (N, C, OH, OW) window means, counting padding (count_include_pad; windows
     * clipped at H + ph, W + pw as PyTorch does with ceil_mode) or, with exclude_pad,
     * only the input elements in the window; dh = dw = 1 */
    ts_status (*avgpool2d)(const ts_pool2d_geom *g, ts_tensor *out, const ts_tensor *x);
    ts_status (*avgpool2d_backward)(const ts_pool2d_geom *g, ts_tensor *gx, const ts_tensor *gout);

    /* Batch statistics for batchnorm in training, computed in double: x (N, C, H, W) ->
     * mean (C), invstd (C) = 1 / sqrt(biased var + eps), and mres (C) (NULL: not wanted) =
     * the double mean minus mean, rounded: mean + mres carries the mean to about 48 bits, so
     * the apply and backward below lose nothing to the mean's float rounding (at |mean| / std
     * = 1e4 that rounding alone is up to 3e-4 of the output). When running_mean/running_var (C)
     * are given they are updated in place: r = (1 - momentum) r + momentum * stat, with the
     * unbiased variance (PyTorch's rule). Needs N*H*W > 1. */
    ts_status (*batchnorm2d_stats)(const ts_tensor *x, float eps, float momentum, ts_tensor *mean, ts_tensor *mres,
                                   ts_tensor *invstd, ts_tensor *running_mean, ts_tensor *running_var);
    /* Eval: invstd (C) = 1 / sqrt(var (C) + eps). */
    ts_status (*batchnorm2d_invstd)(const ts_tensor *var, float eps, ts_tensor *invstd);
    /* out = (x - (mean[c] + mres[c])) * invstd[c] * weight[c] + bias[c], centred: computed as
     * (x - mean) s + (bias - mres s), s = invstd weight, never x s + (bias - mean s), which
     * rounds x s (|mean| / std times the output) and cancels it. mres, weight, bias may be
     * NULL (0, 1, 0). x, out: (N, C, H, W); mean, mres, invstd: (C). out may alias x. */
    ts_status (*batchnorm2d_apply)(ts_tensor *out, const ts_tensor *x, const ts_tensor *mean, const ts_tensor *mres,
                                   const ts_tensor *invstd, const ts_tensor *weight, const ts_tensor *bias);
    /* Gradients of batchnorm2d with gout, x: (N, C, H, W); mean, mres, invstd, weight: (C)
     * (mres may be NULL = 0, weight NULL = 1), centred on mean + mres as the apply.
     * training: mean/invstd were the batch statistics, so gx includes their dependence on
     * x; else they were constants. gx, gw, gb may be NULL. */
    ts_status (*batchnorm2d_backward)(const ts_tensor *gout, const ts_tensor *x, const ts_tensor *mean,
                                      const ts_tensor *mres, const ts_tensor *invstd, const ts_tensor *weight,
                                      bool training, ts_tensor *gx, ts_tensor *gw, ts_tensor *gb);

    /* Adaptive average pooling, x: (P, H, W) planes -> out: (P, OH, OW), window
     * rows [floor(i H / OH), ceil((i + 1) H / OH)) and likewise for columns (PyTorch's). */
    ts_status (*adaptive_avgpool2d)(ts_tensor *out, const ts_tensor *x, int64_t P, int64_t H, int64_t W,
                                    int64_t OH, int64_t OW);
    /* gx: (P, H, W) = each gout: (P, OH, OW) spread evenly over its window (windows may overlap) */
    ts_status (*adaptive_avgpool2d_backward)(ts_tensor *gx, const ts_tensor *gout, int64_t P, int64_t H, int64_t W,
                                             int64_t OH, int64_t OW);

    /* conv2d (x, out; gout, gx), maxpool2d (x, out; gout, gx) and batchnorm2d (x, out; gout, gx) also take
     * BF16 activations, with F32 weights, biases, statistics and their gradients (bfloat16 activations,
     * ts_set_autocast: sums in float32, each output rounded once); where false the op layer widens them to
     * float32 around the float32 kernels */
    bool bf16;
};

/* The CPU backend's instance (src/ops/cpu/spatial.c), which device/cpu.c puts in
 * the table of every CPU device. */
extern const struct ts_kernels_spatial ts_cpu_kernels_spatial;
#ifdef TS_HAVE_CUDA
extern const struct ts_kernels_spatial ts_cuda_kernels_spatial; /* src/ops/cuda/spatial.c */
#endif

#endif
