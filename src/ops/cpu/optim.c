/*
 * ops/cpu/optim.c — CPU kernels of the optim family: fused SGD and AdamW
 * updates, one pass over the elements (OpenMP above PAR_MIN elements).
 * The element formulas (device/k_elem.h) are torch.optim's single-tensor ones, in the same order.
 */
#include "tensor/tensor.h"
#include "device/k_optim.h"
#include "device/k_elem.h"

#include <math.h>
#include <omp.h>

#define PAR_MIN 32768 /* below this many elements, stay on one thread */

/* p, g, buf: (n) */
static ts_status cpu_sgd_step(ts_tensor *p, const ts_tensor *g, ts_tensor *buf, const ts_sgd_args *a) {
    float *pp = ts__f32(p), *pb = buf ? ts__f32(buf) : NULL;
    const float *pg = ts__f32(g);
    int64_t n = ts_tensor_numel(p);
    const ts_elem_sgd_args k = TS_ELEM_SGD_ARGS(a); /* firstprivate below: a copy per thread, which the
                                                       loop's float stores cannot alias (else no SIMD) */
    if (pb) {
#pragma omp parallel for if (n > PAR_MIN) schedule(static) firstprivate(k)
        for (int64_t i = 0; i < n; i++) pp[i] = ts_elem_sgd(pp[i], pg[i], true, &pb[i], &k);
    } else {
#pragma omp parallel for if (n > PAR_MIN) schedule(static) firstprivate(k)
        for (int64_t i = 0; i < n; i++) pp[i] = ts_elem_sgd(pp[i], pg[i], false, NULL, &k);
    }
    return TS_OK;
}

/* p, g, m, v, vmax: (n) */
static ts_status cpu_adamw_step(ts_tensor *p, const ts_tensor *g, ts_tensor *m, ts_tensor *v, ts_tensor *vmax,
                                const ts_adamw_args *a) {
    float *pp = ts__f32(p), *pm = ts__f32(m), *pv = ts__f32(v), *pvm = vmax ? ts__f32(vmax) : NULL;
    const float *pg = ts__f32(g);
    int64_t n = ts_tensor_numel(p);
    const ts_elem_adamw_args k = TS_ELEM_ADAMW_ARGS(a);
    if (pvm) {
#pragma omp parallel for if (n > PAR_MIN) schedule(static) firstprivate(k)
        for (int64_t i = 0; i < n; i++) pp[i] = ts_elem_adamw(pp[i], pg[i], &pm[i], &pv[i], true, &pvm[i], &k);
    } else {
#pragma omp parallel for if (n > PAR_MIN) schedule(static) firstprivate(k)
        for (int64_t i = 0; i < n; i++) pp[i] = ts_elem_adamw(pp[i], pg[i], &pm[i], &pv[i], false, NULL, &k);
    }
    return TS_OK;
}

/* g: (n) */
static ts_status cpu_grad_sumsq(const ts_tensor *g, double *sumsq) {
    const float *pg = ts__f32(g);
    int64_t n = ts_tensor_numel(g);
    double s = 0.0;
#pragma omp parallel for if (n > PAR_MIN) schedule(static) reduction(+ : s)
    for (int64_t i = 0; i < n; i++) s += ts_elem_sq(pg[i]);
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
        bad |= ts_elem_nonfinite(v);
        pg[i] = ts_elem_scale(v, factor);
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
