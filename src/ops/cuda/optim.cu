/*
 * ops/cuda/optim.cu — CUDA kernels of the optim family (launchers declared in optim_cu.h): one thread
 * per element in grid-stride loops, device/k_elem.h's torch.optim formulas. Whether a momentum buffer
 * (SGD) or a running max (AdamW amsgrad) is present is a template argument, so the loop has no
 * branch on it.
 */
#include "ops/cuda/optim_cu.h"

template <bool BUF>
static __global__ void sgd_kernel(float *p, const float *g, float *buf, int64_t n, ts_elem_sgd_args a) {
    TS_CU_LOOP(i, n) p[i] = ts_elem_sgd(p[i], g[i], BUF, BUF ? buf + i : NULL, &a);
}

template <bool AMS>
static __global__ void adamw_kernel(float *p, const float *g, float *m, float *v, float *vmax, int64_t n,
                             ts_elem_adamw_args a) {
    TS_CU_LOOP(i, n) p[i] = ts_elem_adamw(p[i], g[i], m + i, v + i, AMS, AMS ? vmax + i : NULL, &a);
}

/* the flag is set by one thread of each block that saw a non-finite element (all write 1) */
static __global__ void grad_scale_kernel(float *g, float factor, int64_t n, int *flag) {
    int bad = 0;
    TS_CU_LOOP(i, n) {
        float v = g[i];
        bad |= ts_elem_nonfinite(v);
        g[i] = ts_elem_scale(v, factor);
    }
    if (__syncthreads_or(bad) && threadIdx.x == 0) *flag = 1;
}

extern "C" cudaError_t ts_cu_sgd(float *p, const float *g, float *buf, int64_t n, const ts_elem_sgd_args *a,
                                 cudaStream_t s) {
    if (n <= 0) return cudaSuccess;
    if (buf)
        sgd_kernel<true><<<ts_cu_blocks(n), TS_CU_THREADS, 0, s>>>(p, g, buf, n, *a);
    else
        sgd_kernel<false><<<ts_cu_blocks(n), TS_CU_THREADS, 0, s>>>(p, g, NULL, n, *a);
    return cudaGetLastError();
}

extern "C" cudaError_t ts_cu_adamw(float *p, const float *g, float *m, float *v, float *vmax, int64_t n,
                                   const ts_elem_adamw_args *a, cudaStream_t s) {
    if (n <= 0) return cudaSuccess;
    if (vmax)
        adamw_kernel<true><<<ts_cu_blocks(n), TS_CU_THREADS, 0, s>>>(p, g, m, v, vmax, n, *a);
    else
        adamw_kernel<false><<<ts_cu_blocks(n), TS_CU_THREADS, 0, s>>>(p, g, m, v, NULL, n, *a);
    return cudaGetLastError();
}

extern "C" cudaError_t ts_cu_grad_scale(float *g, float factor, int64_t n, int *flag, cudaStream_t s) {
    cudaError_t e = cudaMemsetAsync(flag, 0, sizeof(int), s);
    if (e != cudaSuccess) return e;
    grad_scale_kernel<<<ts_cu_blocks(n), TS_CU_THREADS, 0, s>>>(g, factor, n, flag);
    return cudaGetLastError();
}
