/*
 * ops/cuda/image_cu.h — the launcher of the image family's resampling kernel (ops/cuda/image.cu),
 * called by ops/cuda/image.c. The taps are device/k_image.h's ts_resample_plan, in device memory.
 */
#ifndef TS_OPS_CUDA_IMAGE_CU_H
#define TS_OPS_CUDA_IMAGE_CU_H

#include "ops/cuda/cu.h"

/* out: (C, oh, ow) float32 <- src: a w-wide image of C interleaved uint8 channels (rows of w * C bytes),
 * resampled by the taps x0 (ow), wx (ow * kx), y0 (oh), wy (oh * ky) and normalised by scale, bias (C). */
TS_CU_EXTERN_C cudaError_t ts_cu_resample_u8(float *out, const uint8_t *src, int w, int C, int ow, int oh, int kx,
                                             int ky, const int *x0, const float *wx, const int *y0, const float *wy,
                                             const float *scale3, const float *bias3, cudaStream_t s);

#endif
