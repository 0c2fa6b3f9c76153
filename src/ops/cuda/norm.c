/*
 * ops/cuda/norm.c — the norm family on CUDA devices (see device/k_norm.h): layer_norm and
 * group_norm forward and backward, kernels in ops/cuda/norm.cu. The weight and bias gradients are
 * reduced through per-chunk partials in scratch memory, in a fixed order (deterministic).
 */
#include "ops/cuda/common.h"
#include "device/k_norm.h"
#include "ops/cuda/norm_cu.h"

// out, x: (R, Cg*S); mean, mres (or NULL), invstd: (R); weight, bias: (G*Cg) or NULL
static ts_status cu_group_norm(const ts_norm_geom *g, ts_tensor *out, ts_tensor *mean, ts_tensor *mres,
                               ts_tensor *invstd, const ts_tensor *x, const ts_tensor *weight, const ts_tensor *bias,
                               float eps) {
    ts_device *dev = ts__dev(out);
    TS_CU_BEGIN(dev, s);
    TS_CU_LAUNCH(dev, "norm.group_norm",
                 ts_cu_group_norm(ts__f32(out), ts__f32(mean), mres ? ts__f32(mres) : NULL, ts__f32(invstd),
                                  ts__f32(x), weight ? ts__f32(weight) : NULL, bias ? ts__f32(bias) : NULL, g->R,
                                  g->G, g->Cg, g->S, eps, s));
    return TS_OK;
}

static ts_status cu_group_norm_backward(const ts_norm_geom *g, const ts_tensor *gout, const ts_tensor *x,
                                        const ts_tensor *mean, const ts_tensor *mres, const ts_tensor *invstd,
                                        const ts_tensor *weight, ts_tensor *gx, ts_tensor *gw, ts_tensor *gb) {
    ts_device *dev = ts__dev(x);
    TS_CU_BEGIN(dev, s);
    ts_tensor *sc = NULL; /* partial sums of the weight and bias gradients: pairs of doubles */
    if (gw || gb)
        TS_TRY(ts__scratch_bytes(dev, (size_t)ts_cu_group_norm_parts(g->R, g->G, g->Cg, g->S) * 2 * sizeof(double),
                                 &sc));
    ts_status st = ts__cuda_status(
        dev,
        ts_cu_group_norm_backward(gx ? ts__f32(gx) : NULL, gw ? ts__f32(gw) : NULL, gb ? ts__f32(gb) : NULL,
                                  ts__f32(gout), ts__f32(x), ts__f32(mean), mres ? ts__f32(mres) : NULL,
                                  ts__f32(invstd),
                                  weight ? ts__f32(weight) : NULL, g->R, g->G, g->Cg, g->S,
                                  sc ? (double *)ts__ptr(sc) : NULL, s),
        "norm.group_norm_backward");
    ts_tensor_release(sc);
    return st;
}

const struct ts_kernels_norm ts_cuda_kernels_norm = {
    .group_norm = cu_group_norm,
    .group_norm_backward = cu_group_norm_backward,
};
