/*
 * core/hd.h — TS_HD marks the static inline functions CUDA kernels call too (core/half.h's conversions,
 * device/k_elem.h's element formulas, device/k_image_px.h's resampling): __host__ __device__ under nvcc,
 * nothing elsewhere. No other include, so .cu files can take it.
 */
#ifndef TS_CORE_HD_H
#define TS_CORE_HD_H

#ifndef TS_HD
#ifdef __CUDACC__
#define TS_HD __host__ __device__
#else
#define TS_HD
#endif
#endif

#endif
