/*
 * ops/cuda/image.cu — the resampling kernel of the image family (device/k_image.h): one thread per
 * output pixel, all channels, each value by device/k_image_px.h (src/pipeline/ops.c's arithmetic, in
 * its order, without contracted multiply-adds).
 */
#include "ops/cuda/image_cu.h"
#include "device/k_image_px.h"

typedef struct resample_norm {
    float scale[3], bias[3];
} resample_norm;

__global__ void k_resample_u8(float *out, const uint8_t *src, int w, int C, int ow, int oh, int kx, int ky,
                              const int *x0, const float *wx, const int *y0, const float *wy, resample_norm nm) {
    const int64_t plane = (int64_t)ow * oh;
    TS_CU_LOOP(i, plane) {
        const int oy = (int)(i / ow), ox = (int)(i % ow);
        for (int c = 0; c < C; c++)
            out[c * plane + i] = ts_resample_px(src, w, C, c, x0[ox], y0[oy], wx + (int64_t)ox * kx, kx,
                                                wy + (int64_t)oy * ky, ky, nm.scale[c], nm.bias[c]);
    }
}

extern "C" cudaError_t ts_cu_resample_u8(float *out, const uint8_t *src, int w, int C, int ow, int oh, int kx,
                                         int ky, const int *x0, const float *wx, const int *y0, const float *wy,
                                         const float *scale3, const float *bias3, cudaStream_t s) {
    resample_norm nm;
    for (int c = 0; c < 3; c++) {
        nm.scale[c] = c < C ? scale3[c] : 0.0f;
        nm.bias[c] = c < C ? bias3[c] : 0.0f;
    }
    const int64_t n = (int64_t)ow * oh;
    if (n == 0) return cudaSuccess;
    k_resample_u8<<<ts_cu_blocks(n), TS_CU_THREADS, 0, s>>>(out, src, w, C, ow, oh, kx, ky, x0, wx, y0, wy, nm);
    return cudaGetLastError();
}
