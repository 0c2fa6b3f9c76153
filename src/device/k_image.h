/*
 * device/k_image.h — the image kernel family: decoding JPEG files on the device
 * and resampling them into a batch, for the input pipeline's "mixed" decoding
 * (DALI's decoders.image(device="mixed"): the file is read and its window drawn
 * on the host, the pixels are decoded and resized on the GPU). A backend without
 * a device decoder leaves the table pointer NULL (the CPU devices: their workers
 * decode on the host, src/pipeline/); the pipeline asks the table, never the
 * device's kind.
 *
 * The resampling is the one of src/pipeline/ops.c, given as its taps: output
 * column ox reads source columns x0[ox] .. x0[ox] + kx - 1 weighted by
 * wx[ox * kx ..] (mirroring already applied: the columns of a mirrored output
 * are the reversed ones), output row oy rows y0[oy] .. with wy[oy * ky ..];
 * trailing weights are 0 and are never read past (the first zero weight ends a
 * row's taps, as on the CPU). Each output value is, in this order,
 *   v_k = sum_j wy[j] * src[y0 + j][x0 + k][c]   (j ascending, float products and sums)
 *   a   = sum_k wx[k] * v_k                       (k ascending)
 *   out[c][oy][ox] = a * scale[c] + bias[c]
 * which is the CPU's arithmetic, so given the same pixels the two agree to the
 * float rounding of the compiler's contractions.
 */
#ifndef TS_K_IMAGE_H
#define TS_K_IMAGE_H

#include "device/device.h"

/* Taps and normalisation of one sample (host memory, borrowed for the call). The window's columns and rows
 * are those of the whole image: the device decodes all of it. */
typedef struct ts_resample_plan {
    int src_w, src_h;    /* the image's size in its header (a decoder that reads another refuses the file) */
    int ow, oh;          /* output size */
    int channels;        /* 1 (gray) or 3 (RGB) */
    int kx, ky;          /* taps per output column / row */
    const int *x0, *y0;  /* ow first source columns, oh first source rows (absolute, in the whole image) */
    const float *wx, *wy; /* ow * kx and oh * ky weights */
    float scale[3], bias[3]; /* out = a * scale + bias per channel */
} ts_resample_plan;

/* One host thread's decoder (its own state on the device and its own stream). */
typedef struct ts_image_decoder ts_image_decoder;

struct ts_kernels_image {
    /* A decoder for this device, for one host thread at a time; TS_ERR_UNSUPPORTED with the reason
     * when the device cannot decode (e.g. no nvJPEG library): the caller then decodes on the host. */
    ts_status (*decoder_new)(ts_device *d, ts_image_decoder **out);
    void (*decoder_free)(ts_image_decoder *dec); /* NULL is fine */
    /* Decodes the whole JPEG (RGB for plan->channels 3, luminance for 1) and resamples it by plan into
     * out: (channels, oh, ow) float32 in the device's memory, queued on the decoder's own stream: the
     * writes to out wait for marker out_free (the device's ops: the last readers of out; NULL: none), and
     * *written receives a marker after them (NULL where the device needs none), which the caller hands to
     * device_wait before the device's stream reads out. jpeg may be reused when this returns.
     * TS_ERR_FORMAT / TS_ERR_UNSUPPORTED for a file the device decoder refuses or reads otherwise than
     * the plan's header size (the caller may decode it on the host), naming `name`. */
    ts_status (*jpeg_decode_resample)(ts_image_decoder *dec, const uint8_t *jpeg, size_t n, const char *name,
                                      const ts_resample_plan *plan, void *out, void *out_free, void **written);
};

#ifdef TS_HAVE_CUDA
extern const struct ts_kernels_image ts_cuda_kernels_image; /* src/ops/cuda/image.c (nvJPEG) */
/* Loads nvJPEG once (dlopen: $TS_NVJPEG_LIB, else libnvjpeg.so.13, libnvjpeg.so); TS_ERR_UNSUPPORTED
 * naming what was tried when it cannot (src/ops/cuda/image.c). */
ts_status ts__nvjpeg_load(void);
#endif

#endif /* TS_K_IMAGE_H */
