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
 * Ordering against the device's stream (device/cuda.h): each call records an event on the device's
 * stream that the decoder's stream waits for (whatever was queued before — e.g. the training step
 * still reading the batch slot being refilled — comes first), queues the decode and the resampling on
 * its own stream, and makes the device's stream wait for an event after them (work queued later sees
 * the output). The host blocks only for the previous call's copies before reusing their buffers.
 */
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
    const char *env = getenv("TS_NVJPEG_LIB");
    const char *names[] = {env && *env ? env : NULL, "libnvjpeg.so.13", "libnvjpeg.so"};
    char tried[256] = "";
    size_t len = 0;
    for (int i = 0; i < 3 && !nvj.so; i++) {
        if (!names[i] || (i > 0 && env && *env)) continue; /* an explicit path is the only one tried */
        nvj.so = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
        if (!nvj.so && len < sizeof tried - 1) {
            const char *e = dlerror();
            int k = snprintf(tried + len, sizeof tried - len, "%s%s", len ? "; " : "", e ? e : names[i]);
            len = k < 0 ? len : len + (size_t)k < sizeof tried - 1 ? len + (size_t)k : sizeof tried - 1;
        }
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
            snprintf(nvj.why, sizeof nvj.why, "nvJPEG library %s has no %s", env && *env ? env : "libnvjpeg",
                     syms[i].name);
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
    cudaStream_t stream;
    cudaEvent_t before, after; /* the device's stream so far / this decoder's last call */
    bool pending;              /* `after` was recorded: the host waits for it before reusing the buffers */
    uint8_t *pix;              /* the decoded image (device) */
    size_t pix_cap;
    void *taps, *taps_host;    /* the taps: device memory and its pinned host staging */
    size_t taps_cap;
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
        if (dec->before) cudaEventDestroy(dec->before);
        if (dec->after) cudaEventDestroy(dec->after);
        cudaFree(dec->pix);
        cudaFree(dec->taps);
        cudaFreeHost(dec->taps_host);
    }
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
    if (st == TS_OK) st = cu_call(d, cudaEventCreateWithFlags(&dec->before, cudaEventDisableTiming), "cudaEventCreate");
    if (st == TS_OK) st = cu_call(d, cudaEventCreateWithFlags(&dec->after, cudaEventDisableTiming), "cudaEventCreate");
    if (st != TS_OK) {
        cu_decoder_free(dec);
        return st;
    }
    *out = dec;
    return TS_OK;
}

/* Grows device buffer *p (and its pinned twin *h when h is given) to at least n bytes; the previous
 * call's work must be over (the caller waited for `after`). */
static ts_status grow(ts_device *d, void **p, void **h, size_t *cap, size_t n) {
    if (n <= *cap) return TS_OK;
    n += n / 4;
    cudaFree(*p);
    *p = NULL;
    if (h) {
        cudaFreeHost(*h);
        *h = NULL;
    }
    *cap = 0;
    TS_TRY(cu_call(d, cudaMalloc(p, n), "cudaMalloc (image decoder)"));
    if (h) TS_TRY(cu_call(d, cudaHostAlloc(h, n, cudaHostAllocDefault), "cudaHostAlloc (image decoder)"));
    *cap = n;
    return TS_OK;
}

static size_t align16(size_t n) { return (n + 15) & ~(size_t)15; }

static ts_status cu_jpeg_decode_resample(ts_image_decoder *dec, const uint8_t *jpeg, size_t n, const char *name,
                                         const ts_resample_plan *pl, void *out) {
    ts_device *d = dec->d;
    TS_ARG(pl->channels == 1 || pl->channels == 3, "%s: %d channels (want 1 or 3)", name, pl->channels);
    cudaStream_t ds;
    TS_TRY(ts__cuda_enter(d, &ds));
    int comps = 0, sub = 0, ws[TS_NVJ_MAX_COMPONENT] = {0}, hs[TS_NVJ_MAX_COMPONENT] = {0};
    int s = nvj.image_info(dec->handle, jpeg, n, &comps, &sub, ws, hs);
    if (s != TS_NVJ_SUCCESS)
        return ts_error(s == TS_NVJ_JPEG_NOT_SUPPORTED || s == TS_NVJ_IMPLEMENTATION_NOT_SUPPORTED ? TS_ERR_UNSUPPORTED
                                                                                                    : TS_ERR_FORMAT,
                        "%s: nvJPEG cannot read its header: %s (%d)", name, nvj_status_name(s), s);
    const int w = ws[0], h = hs[0], C = pl->channels;
    TS_ARG(w > 0 && h > 0, "%s: nvJPEG reports a %d x %d image", name, w, h);
    for (int k = 0; k < pl->ow; k++)
        TS_ARG(pl->x0[k] >= 0 && pl->x0[k] < w, "%s: resampling column %d outside the %d-wide image", name,
               pl->x0[k], w);
    for (int k = 0; k < pl->oh; k++)
        TS_ARG(pl->y0[k] >= 0 && pl->y0[k] < h, "%s: resampling row %d outside the %d-high image", name, pl->y0[k], h);
    if (dec->pending) { /* the previous call's copy out of taps_host and its use of pix are done */
        TS_TRY(cu_call(d, cudaEventSynchronize(dec->after), "cudaEventSynchronize (image decoder)"));
        dec->pending = false;
    }
    const size_t nx0 = align16(sizeof(int) * (size_t)pl->ow), nwx = align16(sizeof(float) * (size_t)pl->ow * pl->kx),
                 ny0 = align16(sizeof(int) * (size_t)pl->oh), nwy = align16(sizeof(float) * (size_t)pl->oh * pl->ky);
    TS_TRY(grow(d, (void **)&dec->pix, NULL, &dec->pix_cap, (size_t)w * (size_t)h * (size_t)C));
    TS_TRY(grow(d, &dec->taps, &dec->taps_host, &dec->taps_cap, nx0 + nwx + ny0 + nwy));
    char *th = dec->taps_host, *td = dec->taps;
    memcpy(th, pl->x0, sizeof(int) * (size_t)pl->ow);
    memcpy(th + nx0, pl->wx, sizeof(float) * (size_t)pl->ow * pl->kx);
    memcpy(th + nx0 + nwx, pl->y0, sizeof(int) * (size_t)pl->oh);
    memcpy(th + nx0 + nwx + ny0, pl->wy, sizeof(float) * (size_t)pl->oh * pl->ky);
    /* the device's earlier work (a previous reader of out) first */
    TS_TRY(cu_call(d, cudaEventRecord(dec->before, ds), "cudaEventRecord (image decoder)"));
    TS_TRY(cu_call(d, cudaStreamWaitEvent(dec->stream, dec->before, 0), "cudaStreamWaitEvent (image decoder)"));
    ts_nvj_image img = {{dec->pix}, {(size_t)w * (size_t)C}};
    s = nvj.decode(dec->handle, dec->state, jpeg, n, C == 3 ? TS_NVJ_OUTPUT_RGBI : TS_NVJ_OUTPUT_Y, &img, dec->stream);
    ts_status st = TS_OK;
    if (s != TS_NVJ_SUCCESS)
        st = ts_error(s == TS_NVJ_BAD_JPEG || s == TS_NVJ_INCOMPLETE_BITSTREAM ? TS_ERR_FORMAT
                      : s == TS_NVJ_JPEG_NOT_SUPPORTED || s == TS_NVJ_IMPLEMENTATION_NOT_SUPPORTED
                          ? TS_ERR_UNSUPPORTED
                          : TS_ERR_DEVICE,
                      "%s: nvjpegDecode on %s failed: %s (%d)", name, d->name, nvj_status_name(s), s);
    if (st == TS_OK)
        st = cu_call(d, cudaMemcpyAsync(td, th, nx0 + nwx + ny0 + nwy, cudaMemcpyHostToDevice, dec->stream),
                     "cudaMemcpyAsync (resampling taps)");
    if (st == TS_OK)
        st = cu_call(d,
                     ts_cu_resample_u8(out, dec->pix, w, C, pl->ow, pl->oh, pl->kx, pl->ky, (const int *)td,
                                       (const float *)(td + nx0), (const int *)(td + nx0 + nwx),
                                       (const float *)(td + nx0 + nwx + ny0), pl->scale, pl->bias, dec->stream),
                     "image.resample");
    /* whatever was queued, the device's later work waits for it (a failed decode leaves out unwritten) */
    ts_status rs = cu_call(d, cudaEventRecord(dec->after, dec->stream), "cudaEventRecord (image decoder)");
    if (rs == TS_OK) {
        dec->pending = true;
        rs = cu_call(d, cudaStreamWaitEvent(ds, dec->after, 0), "cudaStreamWaitEvent (image decoder)");
    }
    return st != TS_OK ? st : rs;
}

const struct ts_kernels_image ts_cuda_kernels_image = {
    .decoder_new = cu_decoder_new,
    .decoder_free = cu_decoder_free,
    .jpeg_decode_resample = cu_jpeg_decode_resample,
};
