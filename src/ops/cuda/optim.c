/*
 * ops/cuda/optim.c — the optim kernel table (device/k_optim.h) for CUDA devices: fused SGD and AdamW
 * steps queued on the device's stream; grad_sumsq and grad_scale hand a value to the host, so they
 * copy it back and wait for the stream.
 */
#include "ops/cuda/common.h"
#include "device/k_optim.h"
#include "ops/cuda/ew_cu.h"
#include "ops/cuda/optim_cu.h"

static ts_status need_f32(const char *op, const ts_tensor *t) {
    if (t->dtype == TS_F32) return TS_OK;
    return ts_error(TS_ERR_DTYPE, "%s on %s: %s tensor (want float32)", op, ts__dev(t)->name,
                    ts_dtype_name(t->dtype));
}

/* p, g, buf: (n) */
static ts_status cuda_sgd_step(ts_tensor *p, const ts_tensor *g, ts_tensor *buf, const ts_sgd_args *a) {
    ts_device *dev = ts__dev(p);
    TS_TRY(need_f32("sgd_step", p));
    TS_TRY(need_f32("sgd_step", g));
    if (buf) TS_TRY(need_f32("sgd_step", buf));
    const ts_elem_sgd_args k = TS_ELEM_SGD_ARGS(a);
    TS_CU_BEGIN(dev, s);
    TS_CU_LAUNCH(dev, "optim.sgd_step",
                 ts_cu_sgd(ts__f32(p), ts__f32(g), buf ? ts__f32(buf) : NULL, ts_tensor_numel(p), &k, s));
    return TS_OK;
}

/* p, g, m, v, vmax: (n) */
static ts_status cuda_adamw_step(ts_tensor *p, const ts_tensor *g, ts_tensor *m, ts_tensor *v, ts_tensor *vmax,
                                 const ts_adamw_args *a) {
    ts_device *dev = ts__dev(p);
    TS_TRY(need_f32("adamw_step", p));
    TS_TRY(need_f32("adamw_step", g));
    TS_TRY(need_f32("adamw_step", m));
    TS_TRY(need_f32("adamw_step", v));
    if (vmax) TS_TRY(need_f32("adamw_step", vmax));
    const ts_elem_adamw_args k = TS_ELEM_ADAMW_ARGS(a);
    TS_CU_BEGIN(dev, s);
    TS_CU_LAUNCH(dev, "optim.adamw_step",
                 ts_cu_adamw(ts__f32(p), ts__f32(g), ts__f32(m), ts__f32(v), vmax ? ts__f32(vmax) : NULL,
                             ts_tensor_numel(p), &k, s));
    return TS_OK;
}

/* g: (n). The double sum lands in the first 8 bytes of a device block, the reduction's partials
 * after it; then copied to *sumsq. */
static ts_status cuda_grad_sumsq(const ts_tensor *g, double *sumsq) {
    ts_device *dev = ts__dev(g);
    TS_TRY(need_f32("grad_sumsq", g));
    int64_t n = ts_tensor_numel(g);
    TS_CU_BEGIN(dev, s);
    size_t bytes = sizeof(double) + ts_cu_rowsum_scratch(1, n);
    double *res = ts__device_alloc(dev, bytes);
    if (!res) return TS_ERR_NOMEM;
    double host = 0.0;
    ts_status st = ts__cuda_status(dev, ts_cu_sumsq(res, ts__f32(g), n, res + 1, s), "optim.grad_sumsq");
    if (st == TS_OK)
        st = ts__cuda_status(dev, cudaMemcpyAsync(&host, res, sizeof host, cudaMemcpyDeviceToHost, s),
                             "cudaMemcpyAsync (grad_sumsq)");
    if (st == TS_OK) st = ts__cuda_status(dev, cudaStreamSynchronize(s), "cudaStreamSynchronize (grad_sumsq)");
    ts__device_free(dev, res, bytes);
    if (st == TS_OK) *sumsq = host;
    return st;
}

/* g: (n), scaled in place; a device int flags a non-finite element */
static ts_status cuda_grad_scale(ts_tensor *g, float factor, bool *nonfinite) {
    ts_device *dev = ts__dev(g);
    TS_TRY(need_f32("grad_scale", g));
    TS_CU_BEGIN(dev, s);
    int *flag = ts__device_alloc(dev, sizeof(int));
    if (!flag) return TS_ERR_NOMEM;
    int host = 0;
    ts_status st =
        ts__cuda_status(dev, ts_cu_grad_scale(ts__f32(g), factor, ts_tensor_numel(g), flag, s), "optim.grad_scale");
    if (st == TS_OK)
        st = ts__cuda_status(dev, cudaMemcpyAsync(&host, flag, sizeof host, cudaMemcpyDeviceToHost, s),
                             "cudaMemcpyAsync (grad_scale)");
    if (st == TS_OK) st = ts__cuda_status(dev, cudaStreamSynchronize(s), "cudaStreamSynchronize (grad_scale)");
    ts__device_free(dev, flag, sizeof(int));
    if (st == TS_OK && host) *nonfinite = true;
    return st;
}

const struct ts_kernels_optim ts_cuda_kernels_optim = {
    .sgd_step = cuda_sgd_step,
    .adamw_step = cuda_adamw_step,
    .grad_sumsq = cuda_grad_sumsq,
    .grad_scale = cuda_grad_scale,
};
