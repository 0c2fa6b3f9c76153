/*
 * ops/cuda/optim_cu.h — launchers of the optim family's CUDA kernels (ops/cuda/optim.cu), called by
 * ops/cuda/optim.c. Raw device pointers, n elements (all F32, contiguous), the stream; each returns
 * the launch's cudaError_t. The element formulas and their constants are device/k_elem.h's. (grad_sumsq
 * uses ts_cu_sumsq of ew_cu.h.)
 */
#ifndef TS_OPS_CUDA_OPTIM_CU_H
#define TS_OPS_CUDA_OPTIM_CU_H

#include "ops/cuda/cu.h"
#include "device/k_elem.h"

/* p -= lr g' (with momentum buffer buf unless buf is NULL) */
TS_CU_EXTERN_C cudaError_t ts_cu_sgd(float *p, const float *g, float *buf, int64_t n, const ts_elem_sgd_args *a,
                                     cudaStream_t s);
/* AdamW on p, m, v (and vmax unless it is NULL: amsgrad) */
TS_CU_EXTERN_C cudaError_t ts_cu_adamw(float *p, const float *g, float *m, float *v, float *vmax, int64_t n,
                                       const ts_elem_adamw_args *a, cudaStream_t s);
/* g *= factor; *flag (a device int, zeroed here first) = 1 when an element of g was inf or NaN */
TS_CU_EXTERN_C cudaError_t ts_cu_grad_scale(float *g, float factor, int64_t n, int *flag, cudaStream_t s);

#endif
