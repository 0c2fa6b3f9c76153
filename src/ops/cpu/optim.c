/*
 * ops/cpu/optim.c — CPU kernels of the optim family: fused SGD and AdamW
 * updates, one pass over the elements (OpenMP above PAR_MIN elements).
 * The element formulas are torch.optim's single-tensor ones, in the same order.
 */
#include "tensor/tensor.h"
#include "device/k_optim.h"

#include <math.h>
#include <omp.h>

#define PAR_MIN 32768 /* below this many elements, stay on one thread */

/* p, g, buf: (n) */
static ts_status cpu_sgd_step(ts_tensor *p, const ts_tensor *g, ts_tensor *buf, const ts_sgd_args *a) {
    float *pp = ts__f32(p), *pb = buf ? ts__f32(buf) : NULL;
    const float *pg = ts__f32(g);
    int64_t n = ts_tensor_numel(p);
    const float lr = a->lr, mom = a->momentum, damp1 = 1.0f - a->dampening, wd = a->weight_decay;
    const bool nesterov = a->nesterov, maximize = a->maximize, first = a->first;
#pragma omp parallel for if (n > PAR_MIN) schedule(static)
    for (int64_t i = 0; i < n; i++) {
        float d = maximize ? -pg[i] : pg[i];
        if (wd != 0.0f) d = d + wd * pp[i];
        if (pb) {
            float b = first ? d : pb[i] * mom + damp1 * d;
            pb[i] = b;
            d = nesterov ? d + mom * b : b;
        }
        pp[i] = pp[i] + (-lr) * d;
    }
    return TS_OK;
}

/* p, g, m, v, vmax: (n) */
static ts_status cpu_adamw_step(ts_tensor *p, const ts_tensor *g, ts_tensor *m, ts_tensor *v, ts_tensor *vmax,
                                const ts_adamw_args *a) {
    float *pp = ts__f32(p), *pm = ts__f32(m), *pv = ts__f32(v), *pvm = vmax ? ts__f32(vmax) : NULL;
    const float *pg = ts__f32(g);
    int64_t n = ts_tensor_numel(p);
    const float w1 = 1.0f - a->beta1, beta2 = a->beta2, w2 = 1.0f - a->beta2, eps = a->eps;
    const float decay = a->decay, neg_step = -a->step_size, bc2s = a->bc2_sqrt;
    const bool maximize = a->maximize, apply_decay = a->weight_decay != 0.0f;
#pragma omp parallel for if (n > PAR_MIN) schedule(static)
    for (int64_t i = 0; i < n; i++) {
        float gi = maximize ? -pg[i] : pg[i];
        float x = apply_decay ? pp[i] * decay : pp[i];
        float mi = pm[i];
        /* torch.lerp(m, g, w1) */
        mi = w1 < 0.5f ? mi + w1 * (gi - mi) : gi - (gi - mi) * (1.0f - w1);
        pm[i] = mi;
        float vi = pv[i] * beta2 + w2 * (gi * gi);
        pv[i] = vi;
        if (pvm) {
            vi = fmaxf(pvm[i], vi);
            pvm[i] = vi;
        }
        float denom = sqrtf(vi) / bc2s + eps;
        pp[i] = x + neg_step * (mi / denom);
    }
    return TS_OK;
}

/* g: (n) */
static ts_status cpu_grad_sumsq(const ts_tensor *g, double *sumsq) {
    const float *pg = ts__f32(g);
    int64_t n = ts_tensor_numel(g);
    double s = 0.0;
#pragma omp parallel for if (n > PAR_MIN) schedule(static) reduction(+ : s)
    for (int64_t i = 0; i < n; i++) s += (double)pg[i] * (double)pg[i];
    *sumsq = s;
    return TS_OK;
}

/* g: (n) */
static ts_status cpu_grad_scale(ts_tensor *g, float factor, bool *nonfinite) {
    float *pg = ts__f32(g);
    int64_t n = ts_tensor_numel(g);
    int bad = 0;
#pragma omp parallel for if (n > PAR_MIN) schedule(static) reduction(| : bad)
    for (int64_t i = 0; i < n; i++) {
        float v = pg[i];
        bad |= !isfinite(v);
        pg[i] = v * factor;
    }
    if (bad) *nonfinite = true;
    return TS_OK;
}

const struct ts_kernels_optim ts_cpu_kernels_optim = {
    .sgd_step = cpu_sgd_step,
    .adamw_step = cpu_adamw_step,
    .grad_sumsq = cpu_grad_sumsq,
    .grad_scale = cpu_grad_scale,
};
