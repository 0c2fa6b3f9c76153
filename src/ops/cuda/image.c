/*
 * ops/cuda/image.c — the image family on CUDA devices (device/k_image.h): JPEG decoding with NVIDIA's
 * nvJPEG and resampling (ops/cuda/image.cu), for the input pipeline's "mixed" decoding.
 *
 * nvJPEG is loaded at run time (dlopen): $TS_NVJPEG_LIB when set, else libnvjpeg.so.13 then
 * libnvjpeg.so on the loader's path (the CUDA toolkit's lib64, or NVIDIA's nvidia-nvjpeg package's
 * nvidia/cu13/lib). Without it decoder_new says why and the pipeline decodes on the host. One nvJPEG
 * handle per device (created on first use, kept with the device); one decoder per host thread: its
 * nvJPEG state (the default, hybrid backend: Huffman decoding on the calling thread, the rest on the
 * GPU), its own stream, the decoded image and the taps in device memory.
 *
 * Ordering (device/k_image.h): the decoder's stream copies the taps, decodes into its own buffer, then
 * waits for the caller's out_free marker (an event on the device's stream after the last readers of the
 * batch slot, e.g. the training step that used it) before the resampling writes the slot, and records
 * the `written` event the pipeline makes the device's stream wait for when it hands the batch out. So a
 * decode never waits for training, only the write into a slot still in use does, and the host never
 * waits: the taps are copied from pageable memory, which the copy stages before it returns.
 */
#include "core/env.h"
#include "ops/cuda/common.h"
#include "device/k_image.h"
#include "ops/cuda/image_cu.h"
#include "ops/cuda/nvjpeg_api.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>

/* ---- the library ------------------------------------------------------------------------------ */
static struct {
    void *so;
    ts_nvj_create_simple_fn create_simple;
    ts_nvj_destroy_fn destroy;
    ts_nvj_state_create_fn state_create;
    ts_nvj_state_destroy_fn state_destroy;
    ts_nvj_image_info_fn image_info;
    ts_nvj_decode_fn decode;
    char why[512]; /* why it is not there ("" when loaded) */
} nvj;
static pthread_once_t nvj_once = PTHREAD_ONCE_INIT;

static void nvj_load_once(void) {
    const char *env = ts_env_str(TS_ENV_NVJPEG_LIB); /* an explicit path is the only one tried */
    const char *names[2] = {env && *env ? env : "libnvjpeg.so.13", env && *env ? NULL : "libnvjpeg.so"};
    char tried[256] = "";
    for (int i = 0; i < 2 && names[i] && !nvj.so; i++) {
        if ((nvj.so = dlopen(names[i], RTLD_NOW | RTLD_LOCAL))) break;
        const char *e = dlerror();
        size_t len = strlen(tried);
        snprintf(tried + len, sizeof tried - len, "%s%s", len ? "; " : "", e ? e : names[i]);
    }
    if (!nvj.so) {
        snprintf(nvj.why, sizeof nvj.why, "nvJPEG could not be loaded (%s); set TS_NVJPEG_LIB to libnvjpeg.so.13 "
                                          "(the CUDA toolkit's lib64, or pip's nvidia-nvjpeg: nvidia/cu13/lib)", tried);
        return;
    }
    struct {
        const char *name;
        void **fn;
    } syms[] = {
        {"nvjpegCreateSimple", (void **)&nvj.create_simple}, {"nvjpegDestroy", (void **)&nvj.destroy},
        {"nvjpegJpegStateCreate", (void **)&nvj.state_create}, {"nvjpegJpegStateDestroy", (void **)&nvj.state_destroy},
        {"nvjpegGetImageInfo", (void **)&nvj.image_info}, {"nvjpegDecode", (void **)&nvj.decode},
    };
    for (size_t i = 0; i < sizeof syms / sizeof syms[0]; i++) {
        *syms[i].fn = dlsym(nvj.so, syms[i].name);
        if (!*syms[i].fn) {
            snprintf(nvj.why, sizeof nvj.why, "nvJPEG library %s has no %s", names[0], syms[i].name);
            dlclose(nvj.so);
            nvj.so = NULL;
            return;
        }
    }
}

/* Loads nvJPEG once (above); TS_ERR_UNSUPPORTED with the reason when it cannot. */
ts_status ts__nvjpeg_load(void) {
    pthread_once(&nvj_once, nvj_load_once);
    if (!nvj.so) return ts_error(TS_ERR_UNSUPPORTED, "%s", nvj.why);
    return TS_OK;
}

static const char *nvj_status_name(int s) {
    static const char *const names[] = {"success", "not initialized", "invalid parameter", "bad JPEG",
                                        "JPEG not supported", "allocator failure", "execution failed",
                                        "architecture mismatch", "internal error", "implementation not supported",
                                        "incomplete bitstream"};
    return s >= 0 && s <= 10 ? names[s] : "unknown status";
}

/* ---- decoders --------------------------------------------------------------------------------- */
struct ts_image_decoder {
    ts_device *d;
    ts_nvj_handle handle; /* the device's (borrowed) */
    ts_nvj_state state;
    cudaStream_t stream;  /* everything of this decoder, in order: taps copy, decode, resampling */
    uint8_t *pix;         /* the decoded image (device; only this stream touches it) */
    size_t pix_cap;
    void *taps;           /* the taps (device) */
    size_t taps_cap;
    char *taps_host;      /* their host copy (pageable: the copy stages it before returning) */
    size_t taps_host_cap;
};

static ts_status cu_call(ts_device *d, cudaError_t e, const char *what) { return ts__cuda_status(d, e, what); }

/* The device's nvJPEG handle, created on first use under the device's library lock. */
static ts_status device_handle(ts_device *d, ts_nvj_handle *out) {
    ts__cuda_ctx *c = ts__cuda(d);
    ts_status st = TS_OK;
    pthread_mutex_lock(&c->lib_mu);
    if (!c->nvjpeg) {
        ts_nvj_handle h = NULL;
        int s = nvj.create_simple(&h);
        if (s != TS_NVJ_SUCCESS)
            st = ts_error(TS_ERR_UNSUPPORTED, "%s: nvjpegCreateSimple failed: %s (%d)", d->name, nvj_status_name(s), s);
        else
            c->nvjpeg = h;
    }
    *out = c->nvjpeg;
    pthread_mutex_unlock(&c->lib_mu);
    return st;
}

static void cu_decoder_free(ts_image_decoder *dec) {
    if (!dec) return;
    cudaStream_t s;
    if (ts__cuda_enter(dec->d, &s) == TS_OK) {
        if (dec->stream) cudaStreamSynchronize(dec->stream);
        if (dec->state) nvj.state_destroy(dec->state);
        if (dec->stream) cudaStreamDestroy(dec->stream);
        cudaFree(dec->pix);
        cudaFree(dec->taps);
    }
    free(dec->taps_host);
    free(dec);
}

static ts_status cu_decoder_new(ts_device *d, ts_image_decoder **out) {
    *out = NULL;
    TS_TRY(ts__nvjpeg_load());
    cudaStream_t s;
    TS_TRY(ts__cuda_enter(d, &s));
    ts_image_decoder *dec = calloc(1, sizeof *dec);
    if (!dec) return ts_error(TS_ERR_NOMEM, "%s: an image decoder", d->name);
    dec->d = d;
    ts_status st = device_handle(d, &dec->handle);
    if (st == TS_OK) {
        int ns = nvj.state_create(dec->handle, &dec->state);
        if (ns != TS_NVJ_SUCCESS)
            st = ts_error(TS_ERR_UNSUPPORTED, "%s: nvjpegJpegStateCreate failed: %s (%d)", d->name, nvj_status_name(ns),
                          ns);
    }
    if (st == TS_OK)
        st = cu_call(d, cudaStreamCreateWithFlags(&dec->stream, cudaStreamNonBlocking), "cudaStreamCreate");
    if (st != TS_OK) {
        cu_decoder_free(dec);
        return st;
    }
    *out = dec;
    return TS_OK;
}

/* Grows device buffer *p to at least n bytes. cudaFree waits for the device: growing stops at the largest
 * image the decoder has seen, early in a run. */
static ts_status grow(ts_device *d, void **p, size_t *cap, size_t n) {
    if (n <= *cap) return TS_OK;
    n += n / 4;
    cudaFree(*p);
    *p = NULL;
    *cap = 0;
    TS_TRY(cu_call(d, cudaMalloc(p, n), "cudaMalloc (image decoder)"));
    *cap = n;
    return TS_OK;
}

static size_t align16(size_t n) { return (n + 15) & ~(size_t)15; }

/* nvJPEG's status as ours: a file it cannot take goes to the host decoder (TS_ERR_FORMAT for a bad one, which
 * the host decoder then names; TS_ERR_UNSUPPORTED for the rest, its allocator failing included), a broken
 * device is TS_ERR_DEVICE. */
static ts_status nvj_error(int s, const char *call, const char *name, const ts_device *d) {
    ts_status code = s == TS_NVJ_BAD_JPEG || s == TS_NVJ_INCOMPLETE_BITSTREAM ? TS_ERR_FORMAT
                   : s == TS_NVJ_EXECUTION_FAILED || s == TS_NVJ_INTERNAL_ERROR || s == TS_NVJ_ARCH_MISMATCH
                       ? TS_ERR_DEVICE
                       : TS_ERR_UNSUPPORTED;
    return ts_error(code, "%s: %s on %s failed: %s (%d)", name, call, d->name, nvj_status_name(s), s);
}

static ts_status cu_jpeg_decode_resample(ts_image_decoder *dec, const uint8_t *jpeg, size_t n, const char *name,
                                         const ts_resample_plan *pl, void *out, void *out_free, void **written) {
    ts_device *d = dec->d;
    *written = NULL;
    TS_ARG(pl->channels == 1 || pl->channels == 3, "%s: %d channels (want 1 or 3)", name, pl->channels);
    cudaStream_t ds;
    TS_TRY(ts__cuda_enter(d, &ds));
    int comps = 0, sub = 0, ws[TS_NVJ_MAX_COMPONENT] = {0}, hs[TS_NVJ_MAX_COMPONENT] = {0};
    int s = nvj.image_info(dec->handle, jpeg, n, &comps, &sub, ws, hs);
    if (s != TS_NVJ_SUCCESS) return nvj_error(s, "nvjpegGetImageInfo", name, d);
    const int w = ws[0], h = hs[0], C = pl->channels;
    if (w != pl->src_w || h != pl->src_h) /* the taps reach the header's size: decode it on the host */
        return ts_error(TS_ERR_UNSUPPORTED, "%s: nvJPEG reads a %d x %d image, its header says %d x %d", name, w, h,
                        pl->src_w, pl->src_h);
    const size_t nx0 = align16(sizeof(int) * (size_t)pl->ow), nwx = align16(sizeof(float) * (size_t)pl->ow * pl->kx),
                 ny0 = align16(sizeof(int) * (size_t)pl->oh), nwy = align16(sizeof(float) * (size_t)pl->oh * pl->ky),
                 nt = nx0 + nwx + ny0 + nwy;
    if (nt > dec->taps_host_cap) {
        char *t = realloc(dec->taps_host, nt);
        if (!t) return ts_error(TS_ERR_NOMEM, "%s: %zu bytes of resampling taps", name, nt);
        dec->taps_host = t;
        dec->taps_host_cap = nt;
    }
    TS_TRY(grow(d, (void **)&dec->pix, &dec->pix_cap, (size_t)w * (size_t)h * (size_t)C));
    TS_TRY(grow(d, &dec->taps, &dec->taps_cap, nt));
    char *th = dec->taps_host, *td = dec->taps;
    memcpy(th, pl->x0, sizeof(int) * (size_t)pl->ow);
    memcpy(th + nx0, pl->wx, sizeof(float) * (size_t)pl->ow * pl->kx);
    memcpy(th + nx0 + nwx, pl->y0, sizeof(int) * (size_t)pl->oh);
    memcpy(th + nx0 + nwx + ny0, pl->wy, sizeof(float) * (size_t)pl->oh * pl->ky);
    /* the taps first (the stream is not waiting for anything else yet, so staging them is quick), then the
     * decode into pix (this decoder's alone), then, once out's last readers are done, the resampling */
    TS_TRY(cu_call(d, cudaMemcpyAsync(td, th, nt, cudaMemcpyHostToDevice, dec->stream),
                   "cudaMemcpyAsync (resampling taps)"));
    ts_nvj_image img = {{dec->pix}, {(size_t)w * (size_t)C}};
    s = nvj.decode(dec->handle, dec->state, jpeg, n, C == 3 ? TS_NVJ_OUTPUT_RGBI : TS_NVJ_OUTPUT_Y, &img, dec->stream);
    if (s != TS_NVJ_SUCCESS) return nvj_error(s, "nvjpegDecode", name, d); /* out untouched */
    if (out_free)
        TS_TRY(cu_call(d, cudaStreamWaitEvent(dec->stream, (cudaEvent_t)out_free, 0), "cudaStreamWaitEvent (decoder)"));
    TS_TRY(cu_call(d,
                   ts_cu_resample_u8(out, dec->pix, w, C, pl->ow, pl->oh, pl->kx, pl->ky, (const int *)td,
                                     (const float *)(td + nx0), (const int *)(td + nx0 + nwx),
                                     (const float *)(td + nx0 + nwx + ny0), pl->scale, pl->bias, dec->stream),
                   "image.resample"));
    cudaEvent_t e;
    TS_TRY(cu_call(d, cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate (decoder)"));
    ts_status st = cu_call(d, cudaEventRecord(e, dec->stream), "cudaEventRecord (decoder)");
    if (st != TS_OK) {
        cudaEventDestroy(e);
        cudaStreamSynchronize(dec->stream); /* nobody can wait for the writes: finish them here */
        return st;
    }
    *written = e;
    return TS_OK;
}

const struct ts_kernels_image ts_cuda_kernels_image = {
    .decoder_new = cu_decoder_new,
    .decoder_free = cu_decoder_free,
    .jpeg_decode_resample = cu_jpeg_decode_resample,
};
