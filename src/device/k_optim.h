/*
 * device/k_optim.h — the optim kernel family: fused per-tensor optimizer updates
 * (SGD, AdamW), following torch.optim's single-tensor formulas step by step
 * in float32. The optimizer layer (src/optim) computes every scalar (bias
 * corrections, step sizes) in double on the host and passes them here.
 *
 * All tensors: F32, contiguous, same number of elements, on one device.
 * p is updated in place; state tensors are updated in place.
 */
#ifndef TS_K_OPTIM_H
#define TS_K_OPTIM_H

#include "device/device.h"

typedef struct ts_sgd_args {
    float lr, momentum, dampening, weight_decay;
    bool nesterov, maximize;
    bool first; /* the momentum buffer is new: buf = d_p (no dampening) */
} ts_sgd_args;

typedef struct ts_adamw_args {
    float lr, beta1, beta2, eps, weight_decay;
    float step_size;    /* lr / (1 - beta1^step) */
    float bc2_sqrt;     /* sqrt(1 - beta2^step) */
    float decay;        /* 1 - lr * weight_decay */
    bool amsgrad, maximize;
} ts_adamw_args;

struct ts_kernels_optim {
    /* g' = (maximize ? -g : g) + weight_decay p
     * momentum != 0: buf = first ? g' : momentum buf + (1 - dampening) g';
     *                g' = nesterov ? g' + momentum buf : buf
     * p -= lr g'.  buf is NULL when momentum == 0. */
    ts_status (*sgd_step)(ts_tensor *p, const ts_tensor *g, ts_tensor *buf, const ts_sgd_args *a);
    /* p *= decay; m = lerp(m, g', 1 - beta1); v = beta2 v + (1 - beta2) g'^2;
     * amsgrad: vmax = max(vmax, v), use vmax for v below;
     * p -= step_size m / (sqrt(v) / bc2_sqrt + eps). vmax is NULL unless amsgrad. */
    ts_status (*adamw_step)(ts_tensor *p, const ts_tensor *g, ts_tensor *m, ts_tensor *v, ts_tensor *vmax,
                            const ts_adamw_args *a);
    /* *sumsq = the sum of g's squared elements, accumulated in double (inf or NaN when g holds one). */
    ts_status (*grad_sumsq)(const ts_tensor *g, double *sumsq);
    /* g *= factor in place; *nonfinite |= any element of g (before scaling) is inf or NaN. */
    ts_status (*grad_scale)(ts_tensor *g, float factor, bool *nonfinite);
};

/* The CPU backend's instance (src/ops/cpu/optim.c), which device/cpu.c puts in
 * the table of every CPU device. */
extern const struct ts_kernels_optim ts_cpu_kernels_optim;
#ifdef TS_HAVE_CUDA
extern const struct ts_kernels_optim ts_cuda_kernels_optim; /* src/ops/cuda/optim.c */
#endif

#endif
