/*
 * device/k_image_px.h — one output value of a resampling plan (device/k_image.h), the arithmetic
 * written once: the CUDA kernel of ops/cuda/image.cu runs it per output pixel, and
 * tests/test_pipeline.c replays plans with it on the host against the CPU pipeline's own resampling
 * (src/pipeline/ops.c, which computes the same sums in the same order over whole rows). No library
 * headers, so .cu files can include it; static inline, __host__ __device__ under nvcc.
 *
 * Every product and sum is rounded on its own (TS_IMG_MUL / TS_IMG_ADD: __fmul_rn / __fadd_rn on the
 * device, so nvcc does not fuse them into FMAs the CPU loops do not use).
 */
#ifndef TS_DEVICE_K_IMAGE_PX_H
#define TS_DEVICE_K_IMAGE_PX_H

#include <stdint.h>

#include "core/hd.h" /* TS_HD */

#if defined(__CUDACC__) && defined(__CUDA_ARCH__)
#define TS_IMG_MUL(a, b) __fmul_rn((a), (b))
#define TS_IMG_ADD(a, b) __fadd_rn((a), (b))
#else
#define TS_IMG_MUL(a, b) ((a) * (b))
#define TS_IMG_ADD(a, b) ((a) + (b))
#endif

/* Channel c of the output pixel whose taps are: columns xs .. xs + kx - 1 weighted by wx[0 .. kx), rows
 * ys .. weighted by wy[0 .. ky) (a zero weight after the first ends either list: the taps are
 * zero-padded to kx / ky), over src, a w-wide image of C interleaved uint8 channels; then
 * a * scale + bias. The vertical sums come first, per column, as the CPU's row pass. */
static inline TS_HD float ts_resample_px(const uint8_t *src, int w, int C, int c, int xs, int ys, const float *wx,
                                         int kx, const float *wy, int ky, float scale, float bias) {
    float a = 0.0f;
    for (int k = 0; k < kx; k++) {
        const float wk = wx[k];
        if (k > 0 && wk == 0.0f) break;
        const uint8_t *col = src + ((int64_t)ys * w + xs + k) * C + c;
        float v = TS_IMG_MUL(wy[0], (float)col[0]);
        for (int j = 1; j < ky; j++) {
            const float wj = wy[j];
            if (wj == 0.0f) break;
            v = TS_IMG_ADD(v, TS_IMG_MUL(wj, (float)col[(int64_t)j * w * C]));
        }
        a = k == 0 ? TS_IMG_MUL(v, wk) : TS_IMG_ADD(a, TS_IMG_MUL(v, wk));
    }
    return TS_IMG_ADD(TS_IMG_MUL(a, scale), bias);
}

#endif
