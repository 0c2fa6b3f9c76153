/*
 * tests/nvjpeg_abi.c — compiled (never run) by tests/nvjpeg_api.sh against NVIDIA's own nvjpeg.h:
 * the declarations of src/ops/cuda/nvjpeg_api.h, which let the build go without nvJPEG, must be
 * the header's — the same constants, image struct layout and handle types, enumerations of int's
 * size (passed as int), and every function with the parameters ts_nvj_*_fn mirror.
 */
#include <nvjpeg.h>
#include <stddef.h>

#include "ops/cuda/nvjpeg_api.h"

#define SAME(a, b) _Static_assert((long long)(a) == (long long)(b), #a " != " #b)
#define SAME_TYPE(a, b) _Static_assert(__builtin_types_compatible_p(a, b), #a " is not " #b)

SAME(TS_NVJ_MAX_COMPONENT, NVJPEG_MAX_COMPONENT);
SAME(TS_NVJ_SUCCESS, NVJPEG_STATUS_SUCCESS);
SAME(TS_NVJ_NOT_INITIALIZED, NVJPEG_STATUS_NOT_INITIALIZED);
SAME(TS_NVJ_INVALID_PARAMETER, NVJPEG_STATUS_INVALID_PARAMETER);
SAME(TS_NVJ_BAD_JPEG, NVJPEG_STATUS_BAD_JPEG);
SAME(TS_NVJ_JPEG_NOT_SUPPORTED, NVJPEG_STATUS_JPEG_NOT_SUPPORTED);
SAME(TS_NVJ_ALLOCATOR_FAILURE, NVJPEG_STATUS_ALLOCATOR_FAILURE);
SAME(TS_NVJ_EXECUTION_FAILED, NVJPEG_STATUS_EXECUTION_FAILED);
SAME(TS_NVJ_ARCH_MISMATCH, NVJPEG_STATUS_ARCH_MISMATCH);
SAME(TS_NVJ_INTERNAL_ERROR, NVJPEG_STATUS_INTERNAL_ERROR);
SAME(TS_NVJ_IMPLEMENTATION_NOT_SUPPORTED, NVJPEG_STATUS_IMPLEMENTATION_NOT_SUPPORTED);
SAME(TS_NVJ_INCOMPLETE_BITSTREAM, NVJPEG_STATUS_INCOMPLETE_BITSTREAM);
SAME(TS_NVJ_OUTPUT_Y, NVJPEG_OUTPUT_Y);
SAME(TS_NVJ_OUTPUT_RGBI, NVJPEG_OUTPUT_RGBI);
SAME(sizeof(nvjpegStatus_t), sizeof(int));
SAME(sizeof(nvjpegOutputFormat_t), sizeof(int));
SAME(sizeof(nvjpegChromaSubsampling_t), sizeof(int));
SAME(sizeof(ts_nvj_image), sizeof(nvjpegImage_t));
SAME(offsetof(ts_nvj_image, channel), offsetof(nvjpegImage_t, channel));
SAME(offsetof(ts_nvj_image, pitch), offsetof(nvjpegImage_t, pitch));
SAME(sizeof(((ts_nvj_image *)0)->pitch[0]), sizeof(((nvjpegImage_t *)0)->pitch[0]));
SAME_TYPE(ts_nvj_handle, nvjpegHandle_t);
SAME_TYPE(ts_nvj_state, nvjpegJpegState_t);

/* the header's prototypes are those ts_nvj_*_fn declare, with nvJPEG's enumerations where they take int */
SAME_TYPE(__typeof__(nvjpegCreateSimple), nvjpegStatus_t(nvjpegHandle_t *));
SAME_TYPE(__typeof__(nvjpegDestroy), nvjpegStatus_t(nvjpegHandle_t));
SAME_TYPE(__typeof__(nvjpegJpegStateCreate), nvjpegStatus_t(nvjpegHandle_t, nvjpegJpegState_t *));
SAME_TYPE(__typeof__(nvjpegJpegStateDestroy), nvjpegStatus_t(nvjpegJpegState_t));
SAME_TYPE(__typeof__(nvjpegGetImageInfo), nvjpegStatus_t(nvjpegHandle_t, const unsigned char *, size_t, int *,
                                                         nvjpegChromaSubsampling_t *, int *, int *));
SAME_TYPE(__typeof__(nvjpegDecode), nvjpegStatus_t(nvjpegHandle_t, nvjpegJpegState_t, const unsigned char *, size_t,
                                                   nvjpegOutputFormat_t, nvjpegImage_t *, cudaStream_t));
/* and ours have the same shapes, int for the enumerations */
SAME_TYPE(ts_nvj_create_simple_fn, int (*)(nvjpegHandle_t *));
SAME_TYPE(ts_nvj_destroy_fn, int (*)(nvjpegHandle_t));
SAME_TYPE(ts_nvj_state_create_fn, int (*)(nvjpegHandle_t, nvjpegJpegState_t *));
SAME_TYPE(ts_nvj_state_destroy_fn, int (*)(nvjpegJpegState_t));
SAME_TYPE(ts_nvj_image_info_fn, int (*)(nvjpegHandle_t, const unsigned char *, size_t, int *, int *, int *, int *));
SAME_TYPE(ts_nvj_decode_fn, int (*)(nvjpegHandle_t, nvjpegJpegState_t, const unsigned char *, size_t, int,
                                    ts_nvj_image *, cudaStream_t));
