/*
 * device/k_norm.h — the norm kernel family: per-row normalisation with a
 * per-channel affine, forward and backward, behind layer_norm and group_norm
 * (batchnorm2d, whose statistics run over the batch, is in k_spatial.h). Every
 * backend provides one instance (src/ops/cpu/norm.c for the CPU).
 *
 * The op layer (src/ops/norm.c) checks arguments, allocates contiguous results
 * on the inputs' device and calls these kernels. All tensors passed here are
 * contiguous F32.
 *
 * Geometry: x seen as R rows of D = Cg * S elements; each row is normalised by
 * its own mean and biased variance. Row r holds channels (r % G) * Cg + c for
 * c in [0, Cg), S elements each, and the affine weight/bias are indexed by that
 * channel (G * Cg entries).
 *   group_norm, x (N, C, *):   R = N * G, G = num_groups, Cg = C / G, S = prod(*)
 *   layer_norm over D last:    R = numel / D, G = 1, Cg = D, S = 1
 */
#ifndef TS_K_NORM_H
#define TS_K_NORM_H

#include "device/device.h"

typedef struct ts_norm_geom {
    int64_t R, G, Cg, S;
} ts_norm_geom;

struct ts_kernels_norm {
    /* out, x: (R, Cg*S); mean, invstd: (R) <- each row's mean and 1 / sqrt(biased var + eps),
     * computed in double (two passes: the variance about the mean), and mres (R) (NULL: not
     * wanted) = the double mean minus mean, rounded (batchnorm2d_stats's); out = (x - mean - mres)
     * invstd weight[ch] + bias[ch], centred; weight, bias: (G*Cg) or NULL (1, 0). */
    ts_status (*group_norm)(const ts_norm_geom *g, ts_tensor *out, ts_tensor *mean, ts_tensor *mres,
                            ts_tensor *invstd, const ts_tensor *x, const ts_tensor *weight, const ts_tensor *bias,
                            float eps);
    /* Gradients given gout (like x) and the forward's mean, mres (NULL: 0), invstd: with
     * xhat = (x - mean - mres) invstd, gw[ch] = sum g xhat, gb[ch] = sum g over every element of
     * channel ch, and per row gx = invstd (h - mean(h) - xhat mean(h xhat)), h = g weight[ch].
     * gx (like x), gw, gb (G*Cg) may be NULL (not wanted); those given are overwritten. weight
     * may be NULL (1). */
    ts_status (*group_norm_backward)(const ts_norm_geom *g, const ts_tensor *gout, const ts_tensor *x,
                                     const ts_tensor *mean, const ts_tensor *mres, const ts_tensor *invstd,
                                     const ts_tensor *weight, ts_tensor *gx, ts_tensor *gw, ts_tensor *gb);
};

/* The CPU backend's instance (src/ops/cpu/norm.c), which device/cpu.c puts in
 * the table of every CPU device. */
extern const struct ts_kernels_norm ts_cpu_kernels_norm;
#ifdef TS_HAVE_CUDA
extern const struct ts_kernels_norm ts_cuda_kernels_norm; /* src/ops/cuda/norm.c */
#endif

#endif /* TS_K_NORM_H */
