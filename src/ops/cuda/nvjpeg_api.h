/*
 * ops/cuda/nvjpeg_api.h — the part of nvJPEG's C API that ops/cuda/image.c calls, declared here as
 * nvjpeg.h of CUDA 13 (libnvjpeg.so.13, NVIDIA's nvidia-nvjpeg package) declares it, so that the
 * build needs no nvJPEG: image.c loads the library at run time and a machine without it decodes on
 * the host. The handle types use nvjpeg.h's struct tags (the pointers are the same types);
 * enumerations are passed as int (the same size, checked). tests/nvjpeg_api.sh compiles these
 * declarations against the real header where the package is installed (values, sizes, the image
 * struct's layout) and test_cuda_host resolves every symbol from the real library.
 */
#ifndef TS_OPS_CUDA_NVJPEG_API_H
#define TS_OPS_CUDA_NVJPEG_API_H

#include <cuda_runtime.h>
#include <stddef.h>

#define TS_NVJ_MAX_COMPONENT 4 /* NVJPEG_MAX_COMPONENT */

enum { /* nvjpegStatus_t */
    TS_NVJ_SUCCESS = 0,
    TS_NVJ_NOT_INITIALIZED = 1,
    TS_NVJ_INVALID_PARAMETER = 2,
    TS_NVJ_BAD_JPEG = 3,
    TS_NVJ_JPEG_NOT_SUPPORTED = 4,
    TS_NVJ_ALLOCATOR_FAILURE = 5,
    TS_NVJ_EXECUTION_FAILED = 6,
    TS_NVJ_ARCH_MISMATCH = 7,
    TS_NVJ_INTERNAL_ERROR = 8,
    TS_NVJ_IMPLEMENTATION_NOT_SUPPORTED = 9,
    TS_NVJ_INCOMPLETE_BITSTREAM = 10
};
enum { /* nvjpegOutputFormat_t */
    TS_NVJ_OUTPUT_Y = 2,    /* luminance into channel[0] */
    TS_NVJ_OUTPUT_RGBI = 5  /* interleaved RGB into channel[0] */
};

typedef struct nvjpegHandle *ts_nvj_handle;     /* nvjpegHandle_t */
typedef struct nvjpegJpegState *ts_nvj_state;   /* nvjpegJpegState_t */
typedef struct ts_nvj_image {                   /* nvjpegImage_t */
    unsigned char *channel[TS_NVJ_MAX_COMPONENT];
    size_t pitch[TS_NVJ_MAX_COMPONENT];
} ts_nvj_image;

/* The functions, by the names image.c looks up. */
typedef int (*ts_nvj_create_simple_fn)(ts_nvj_handle *handle);                        /* nvjpegCreateSimple */
typedef int (*ts_nvj_destroy_fn)(ts_nvj_handle handle);                               /* nvjpegDestroy */
typedef int (*ts_nvj_state_create_fn)(ts_nvj_handle handle, ts_nvj_state *state);     /* nvjpegJpegStateCreate */
typedef int (*ts_nvj_state_destroy_fn)(ts_nvj_state state);                           /* nvjpegJpegStateDestroy */
typedef int (*ts_nvj_image_info_fn)(ts_nvj_handle handle, const unsigned char *data, size_t length,
                                    int *n_components, int *subsampling, int *widths, int *heights); /* nvjpegGetImageInfo */
typedef int (*ts_nvj_decode_fn)(ts_nvj_handle handle, ts_nvj_state state, const unsigned char *data, size_t length,
                                int output_format, ts_nvj_image *destination, cudaStream_t stream); /* nvjpegDecode */

#endif
