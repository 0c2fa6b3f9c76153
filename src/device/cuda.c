/*
 * device/cuda.c — CUDA devices (see device/cuda.h): creation, the caching
 * allocator over cudaMalloc, copies and synchronisation on the device's stream,
 * and the deferred index checks looked at when the host synchronises.
 * Built into every Tessera; without TS_HAVE_CUDA it only says why there are no
 * CUDA devices. Like cpu.c this file only builds devices; device.c registers them.
 */
#include "device/cuda.h"
#include "core/env.h"

#include <stdio.h>

#ifndef TS_HAVE_CUDA

int ts__cuda_device_count(char *why, size_t why_len) {
    snprintf(why, why_len, "this Tessera was built without CUDA (configure with -DTS_CUDA=ON on a machine with the "
                           "CUDA toolkit, cuBLAS and cuDNN)");
    return 0;
}

ts_status ts__cuda_device_new(int ordinal, ts_device **out) {
    *out = NULL;
    return ts_error(TS_ERR_DEVICE, "cuda:%d: this Tessera was built without CUDA", ordinal);
}

void ts__cuda_device_describe(const ts_device *d, char *buf, size_t len) { snprintf(buf, len, "%s", d->name); }

#else

#include "device/k_blas.h"
#include "device/k_ew.h"
#include "device/k_misc.h"
#include "device/k_norm.h"
#include "device/k_image.h"
#include "device/k_optim.h"
#include "device/k_spatial.h"
#include "device/cuda_check.h"

#include <dlfcn.h>

static ts_device ts_cuda_devices[TS_MAX_CUDA_DEVICES];
static ts__cuda_ctx ts_cuda_ctxs[TS_MAX_CUDA_DEVICES];

ts_status ts__cuda_status(const ts_device *d, cudaError_t e, const char *call) {
    if (e == cudaSuccess) return TS_OK;
    (void)cudaGetLastError(); /* clear a sticky non-fatal error so the next call does not report it again */
    return ts_error(e == cudaErrorMemoryAllocation ? TS_ERR_NOMEM : TS_ERR_DEVICE, "%s: %s failed: %s (%s)",
                    d ? d->name : "cuda", call, cudaGetErrorString(e), cudaGetErrorName(e));
}

/* Why CUDA cannot start, in words that say what is true. The runtime answers cudaErrorInsufficientDriver
 * ("CUDA driver version is insufficient for CUDA runtime version") both when the driver is too old and
 * when there is none at all, so the driver library is asked itself: no libcuda.so.1 (which the NVIDIA
 * driver installs) is no driver; otherwise cuDriverGetVersion says which CUDA it supports. */
static void explain_no_cuda(cudaError_t e, char *why, size_t why_len) {
    int rt = 0;
    (void)cudaRuntimeGetVersion(&rt);
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *dl = dlerror(), *lib = "libcuda.so.1: ";
        if (dl && strncmp(dl, lib, strlen(lib)) == 0) dl += strlen(lib);
        snprintf(why, why_len, "no NVIDIA GPU driver found (libcuda.so.1: %s); this Tessera's CUDA %d.%d runtime needs "
                 "the NVIDIA driver and a GPU", dl ? dl : "not found", rt / 1000, rt % 1000 / 10);
        return;
    }
    int (*driver_version)(int *) = (int (*)(int *))dlsym(h, "cuDriverGetVersion");
    int dv = 0;
    if (!driver_version || driver_version(&dv) != 0) dv = 0;
    if (dv > 0 && dv < rt)
        snprintf(why, why_len, "the NVIDIA driver is older than this Tessera's CUDA runtime needs: the driver supports "
                 "CUDA %d.%d, the runtime is CUDA %d.%d (update the driver)", dv / 1000, dv % 1000 / 10, rt / 1000,
                 rt % 1000 / 10);
    else if (e == cudaErrorNoDevice)
        snprintf(why, why_len, "the NVIDIA driver (CUDA %d.%d) finds no GPU", dv / 1000, dv % 1000 / 10);
    else
        snprintf(why, why_len, "the NVIDIA driver (CUDA %d.%d) cannot start CUDA: %s (%s)", dv / 1000, dv % 1000 / 10,
                 cudaGetErrorString(e), cudaGetErrorName(e));
    dlclose(h);
}

int ts__cuda_device_count(char *why, size_t why_len) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        if (why && why_len) explain_no_cuda(e, why, why_len);
        return 0;
    }
    if (n == 0) snprintf(why, why_len, "the CUDA driver reports no GPU");
    return TS_MIN(n, TS_MAX_CUDA_DEVICES);
}

ts_status ts__cuda_enter(ts_device *d, cudaStream_t *stream) {
    ts__cuda_ctx *c = ts__cuda(d);
    int cur = -1;
    if (cudaGetDevice(&cur) != cudaSuccess || cur != c->ordinal) TS_CUDA_TRY(d, cudaSetDevice(c->ordinal));
    if (stream) *stream = c->stream;
    return TS_OK;
}

static void *raw_alloc(void *ctx, size_t n) {
    void *p = NULL;
    if (cudaMalloc(&p, n) != cudaSuccess) {
        (void)cudaGetLastError();
        return NULL;
    }
    return p;
}

static void raw_free(void *ctx, void *p) { (void)cudaFree(p); }

static void *cuda_alloc(ts_device *d, size_t nbytes) {
    if (ts__cuda_enter(d, NULL) != TS_OK) return NULL;
    return ts__cache_get(&ts__cuda(d)->cache, nbytes);
}

static void cuda_free(ts_device *d, void *p, size_t nbytes) {
    if (ts__cuda_enter(d, NULL) != TS_OK) return;
    ts__cache_put(&ts__cuda(d)->cache, p, nbytes);
}

/* ---- deferred index checks (device/cuda.h) ---------------------------------------------------------- */
_Static_assert(sizeof(ts_cu_bad_rec) == 64, "ts_cu_bad_rec: 64 bytes, copied whole to the host");

/* The CPU's messages (ops/cpu/misc.c) for a bad record r (r->pos != TS_CU_NO_BAD), from what the kernels filled. */
static void bad_index_text(const ts_cu_bad_rec *r, char *buf, size_t len) {
    const long long pos = (long long)r->pos, val = r->val;
    const ts_cu_bad_what *w = &r->what;
    if (w->op == TS_CU_BAD_EMBEDDING) /* a: n, b: num, c: dim */
        snprintf(buf, len,
                 "embedding: index %lld (at flat position %lld of the indices) is out of range [0, %lld) for "
                 "weight [%lld, %lld]",
                 val, pos, w->b, w->b, w->c);
    else if (w->c == 1) /* cross_entropy; a: N, b: C, c: S, d: ignore_index */
        snprintf(buf, len,
                 "cross_entropy: target %lld of sample %lld is out of range [0, %lld) for logits [%lld, %lld] "
                 "(ignore_index is %lld)",
                 val, pos, w->b, w->a, w->b, w->d);
    else
        snprintf(buf, len,
                 "cross_entropy: target %lld of sample %lld at position %lld (flat over the spatial dims) is out "
                 "of range [0, %lld) (ignore_index is %lld)",
                 val, w->c ? pos / w->c : pos, w->c ? pos % w->c : 0, w->b, w->d);
}

/* With check_mu held: if the latest queued copy of the record has landed in check_host, looks at it and,
 * for a bad index, clears the record and returns the error. Never waits: a copy still in flight stays
 * pending. The event is the latest copy's, and copies are queued only under check_mu, so a finished
 * event means no copy is writing check_host and every checking op queued so far has run. */
static ts_status check_poll_locked(ts_device *d, cudaStream_t s) {
    ts__cuda_ctx *c = ts__cuda(d);
    if (!c->check_pending) return TS_OK;
    cudaError_t e = cudaEventQuery(c->check_copied);
    if (e == cudaErrorNotReady) {
        (void)cudaGetLastError(); /* not an error: leave it pending */
        return TS_OK;
    }
    TS_CUDA_TRY(d, e);
    c->check_pending = false;
    ts_cu_bad_rec r;
    memcpy(&r, c->check_host, sizeof r);
    if (r.pos == TS_CU_NO_BAD) return TS_OK;
    /* cleared in stream order (nothing that writes it is in flight: see above), so later ops report again */
    memset(c->check_host, 0xff, sizeof r);
    TS_CUDA_TRY(d, cudaMemsetAsync(c->check_dev, 0xff, sizeof r, s));
    char msg[384];
    bad_index_text(&r, msg, sizeof msg);
    return ts_error(TS_ERR_INVALID_ARG,
                    "%s [found on %s by the op's check on the device and reported at this later synchronisation: "
                    "CUDA ops run asynchronously]",
                    msg, d->name);
}

static ts_status check_poll(ts_device *d, cudaStream_t s) {
    ts__cuda_ctx *c = ts__cuda(d);
    pthread_mutex_lock(&c->check_mu);
    ts_status st = check_poll_locked(d, s);
    pthread_mutex_unlock(&c->check_mu);
    return st;
}

ts_status ts__cuda_check_begin(ts_device *d, cudaStream_t s, void **rec) {
    ts__cuda_ctx *c = ts__cuda(d);
    *rec = NULL;
    pthread_mutex_lock(&c->check_mu);
    ts_status st = check_poll_locked(d, s);
    if (st != TS_OK) {
        pthread_mutex_unlock(&c->check_mu);
        return st;
    }
    *rec = c->check_dev;
    return TS_OK;
}

ts_status ts__cuda_check_end(ts_device *d, cudaStream_t s, ts_status st) {
    ts__cuda_ctx *c = ts__cuda(d);
    if (st == TS_OK)
        st = ts__cuda_status(d, cudaMemcpyAsync(c->check_host, c->check_dev, sizeof(ts_cu_bad_rec),
                                                cudaMemcpyDeviceToHost, s),
                             "cudaMemcpyAsync (index check)");
    if (st == TS_OK) st = ts__cuda_status(d, cudaEventRecord(c->check_copied, s), "cudaEventRecord (index check)");
    if (st == TS_OK) c->check_pending = true;
    else if (cudaMemsetAsync((char *)c->check_dev + offsetof(ts_cu_bad_rec, cur), 0xff, sizeof(unsigned long long),
                             s) != cudaSuccess)
        (void)cudaGetLastError(); /* a failed launch may have left its rec->cur set: clear it for the next op */
    pthread_mutex_unlock(&c->check_mu);
    return st;
}

/* Waits for the device: its worker's tasks, then its stream. */
static ts_status cuda_wait(ts_device *d, cudaStream_t *s) {
    TS_TRY(ts__stream_synchronize(d->stream)); /* tasks submitted to the device's worker */
    TS_TRY(ts__cuda_enter(d, s));
    TS_CUDA_TRY(d, cudaStreamSynchronize(*s));
    return TS_OK;
}

/* Host memory is pageable (any pointer a caller gives): the copy is queued on the device's stream and
 * waited for, so the caller may reuse its buffer, and reads after earlier queued kernels. The wait is a
 * synchronisation point: a bad index found by an earlier op is reported here (after the copy is done). */
static ts_status cuda_copy(ts_device *d, void *dst, const void *src, size_t n, enum cudaMemcpyKind kind,
                           bool wait) {
    if (!n) return TS_OK;
    cudaStream_t s;
    TS_TRY(ts__cuda_enter(d, &s));
    TS_CUDA_TRY(d, cudaMemcpyAsync(dst, src, n, kind, s));
    if (wait) {
        TS_CUDA_TRY(d, cudaStreamSynchronize(s));
        TS_TRY(check_poll(d, s));
    }
    return TS_OK;
}

static ts_status cuda_h2d(ts_device *d, void *dst, const void *src, size_t n) {
    return cuda_copy(d, dst, src, n, cudaMemcpyHostToDevice, true);
}
static ts_status cuda_d2h(ts_device *d, void *dst, const void *src, size_t n) {
    return cuda_copy(d, dst, src, n, cudaMemcpyDeviceToHost, true);
}
static ts_status cuda_d2d(ts_device *d, void *dst, const void *src, size_t n) {
    return cuda_copy(d, dst, src, n, cudaMemcpyDeviceToDevice, false);
}

static ts_status cuda_memset0(ts_device *d, void *dst, size_t n) {
    if (!n) return TS_OK;
    cudaStream_t s;
    TS_TRY(ts__cuda_enter(d, &s));
    TS_CUDA_TRY(d, cudaMemsetAsync(dst, 0, n, s));
    return TS_OK;
}

static ts_status cuda_sync(ts_device *d) {
    cudaStream_t s;
    TS_TRY(cuda_wait(d, &s));
    return check_poll(d, s); /* a bad index found by an earlier op */
}

/* Waits without looking at the index checks: its status is not returned, and a bad index must not be
 * lost to it. */
static void cuda_empty_cache(ts_device *d) {
    cudaStream_t s;
    if (cuda_wait(d, &s) != TS_OK) return;
    ts__cache_empty(&ts__cuda(d)->cache);
}

static size_t cuda_reserved(const ts_device *d) { return ts__cache_get_stats(&ts__cuda(d)->cache).reserved; }

/* Pinned host memory for staging (the input pipeline's batches): copies from it are truly asynchronous. */
static void *cuda_host_alloc(ts_device *d, size_t n) {
    void *p = NULL;
    cudaStream_t s;
    if (ts__cuda_enter(d, &s) != TS_OK || cudaHostAlloc(&p, n ? n : 1, cudaHostAllocDefault) != cudaSuccess) {
        cudaGetLastError(); /* not sticky: the caller falls back to pageable memory */
        return NULL;
    }
    return p;
}
static void cuda_host_free(ts_device *d, void *p) {
    (void)d;
    if (p) cudaFreeHost(p);
}

/* Markers are events: recorded on the device's stream, waited for by the host (cudaEventBlockingSync: the
 * waiting thread sleeps instead of spinning, the decoders' Huffman work needs the cores) or by the stream. */
static ts_status marker_new(ts_device *d, cudaStream_t s, void **marker) {
    cudaEvent_t e;
    TS_CUDA_TRY(d, cudaEventCreateWithFlags(&e, cudaEventDisableTiming | cudaEventBlockingSync));
    ts_status st = ts__cuda_status(d, cudaEventRecord(e, s), "cudaEventRecord (marker)");
    if (st != TS_OK) {
        cudaEventDestroy(e);
        return st;
    }
    *marker = e;
    return TS_OK;
}
static ts_status cuda_marker_record(ts_device *d, void **marker) {
    *marker = NULL;
    cudaStream_t s;
    TS_TRY(ts__cuda_enter(d, &s));
    return marker_new(d, s, marker);
}

/* The copy is queued on the device's stream (after the work that may still read dst, before the work
 * queued later that reads it), a marker after it tells when src may be written again. (A bad index an
 * earlier op left is reported at the next synchronisation, not here: this one does not wait.) */
static ts_status cuda_h2d_async(ts_device *d, void *dst, const void *src, size_t n, void **done) {
    if (done) *done = NULL;
    cudaStream_t s;
    TS_TRY(ts__cuda_enter(d, &s));
    if (n) TS_CUDA_TRY(d, cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, s));
    return done ? marker_new(d, s, done) : TS_OK;
}
static ts_status cuda_host_wait(ts_device *d, void *marker) {
    if (!marker) return TS_OK;
    cudaStream_t s;
    ts_status st = ts__cuda_enter(d, &s);
    if (st == TS_OK) st = ts__cuda_status(d, cudaEventSynchronize((cudaEvent_t)marker), "cudaEventSynchronize (marker)");
    cudaEventDestroy((cudaEvent_t)marker);
    return st;
}
static ts_status cuda_device_wait(ts_device *d, void *marker) {
    if (!marker) return TS_OK;
    cudaStream_t s;
    ts_status st = ts__cuda_enter(d, &s);
    if (st == TS_OK) st = ts__cuda_status(d, cudaStreamWaitEvent(s, (cudaEvent_t)marker, 0), "cudaStreamWaitEvent (marker)");
    cudaEventDestroy((cudaEvent_t)marker); /* released once the stream is past it */
    return st;
}
static void cuda_marker_free(ts_device *d, void *marker) {
    (void)d;
    if (marker) cudaEventDestroy((cudaEvent_t)marker);
}

/* Once per pair: lets d read and write from's memory directly where the GPUs can (NVLink, PCIe P2P). */
_Static_assert(TS_MAX_CUDA_DEVICES <= 32, "peer_tried holds one bit per CUDA device");
static void peer_enable(ts_device *d, ts_device *from) {
    ts__cuda_ctx *c = ts__cuda(d);
    const int o = ts__cuda(from)->ordinal;
    pthread_mutex_lock(&c->lib_mu);
    if (!(c->peer_tried & (1u << o))) {
        c->peer_tried |= 1u << o;
        int can = 0;
        if (cudaDeviceCanAccessPeer(&can, c->ordinal, o) == cudaSuccess && can &&
            cudaDeviceEnablePeerAccess(o, 0) != cudaSuccess)
            ts_log(TS_LOG_DEBUG, "%s: no peer access to %s: %s", d->name, from->name,
                   cudaGetErrorString(cudaGetLastError()));
        cudaGetLastError(); /* "already enabled" and the like are not sticky: copies work either way */
    }
    pthread_mutex_unlock(&c->lib_mu);
}

static ts_status cuda_peer(ts_device *d, void *dst, ts_device *from, const void *src, size_t n) {
    if (!n) return TS_OK;
    void *before = NULL, *after = NULL;
    cudaStream_t ds;
    TS_TRY(cuda_marker_record(from, &before)); /* the source's work so far, */
    TS_TRY(cuda_device_wait(d, before));       /* then the copy on the destination's stream, */
    TS_TRY(ts__cuda_enter(d, &ds));
    peer_enable(d, from);
    TS_CUDA_TRY(d, cudaMemcpyPeerAsync(dst, ts__cuda(d)->ordinal, src, ts__cuda(from)->ordinal, n, ds));
    TS_TRY(cuda_marker_record(d, &after));
    return cuda_device_wait(from, after); /* and the source's later work (src's block reused) after it */
}

static const ts_device_ops cuda_ops = {
    .alloc = cuda_alloc,
    .free = cuda_free,
    .copy_h2d = cuda_h2d,
    .copy_d2h = cuda_d2h,
    .copy_d2d = cuda_d2d,
    .memset0 = cuda_memset0,
    .synchronize = cuda_sync,
    .empty_cache = cuda_empty_cache,
    .reserved = cuda_reserved,
    .host_alloc = cuda_host_alloc,
    .host_free = cuda_host_free,
    .copy_h2d_async = cuda_h2d_async,
    .marker_record = cuda_marker_record,
    .host_wait = cuda_host_wait,
    .device_wait = cuda_device_wait,
    .marker_free = cuda_marker_free,
    .copy_peer = cuda_peer,
};

ts_status ts__cuda_device_new(int ordinal, ts_device **out) {
    *out = NULL;
    TS_ARG(ordinal >= 0 && ordinal < TS_MAX_CUDA_DEVICES, "cuda:%d: at most %d CUDA devices", ordinal,
           TS_MAX_CUDA_DEVICES);
    ts_device *d = &ts_cuda_devices[ordinal];
    ts__cuda_ctx *c = &ts_cuda_ctxs[ordinal];
    memset(c, 0, sizeof *c);
    snprintf(d->name, sizeof d->name, "cuda:%d", ordinal);
    d->type = TS_DEVICE_CUDA;
    d->index = ordinal;
    d->host_accessible = false;
    d->ops = &cuda_ops;
    d->ctx = c;
    c->ordinal = ordinal;
    pthread_mutex_init(&c->lib_mu, NULL);
    TS_CUDA_TRY(d, cudaSetDevice(ordinal));
    TS_CUDA_TRY(d, cudaGetDeviceProperties(&c->prop, ordinal));
    TS_CUDA_TRY(d, cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking));
    /* the index-check record, clear (all ones) on the device before any op's kernel and on the host */
    pthread_mutex_init(&c->check_mu, NULL);
    TS_CUDA_TRY(d, cudaMalloc(&c->check_dev, sizeof(ts_cu_bad_rec)));
    TS_CUDA_TRY(d, cudaHostAlloc(&c->check_host, sizeof(ts_cu_bad_rec), cudaHostAllocDefault));
    memset(c->check_host, 0xff, sizeof(ts_cu_bad_rec));
    TS_CUDA_TRY(d, cudaMemsetAsync(c->check_dev, 0xff, sizeof(ts_cu_bad_rec), c->stream));
    TS_CUDA_TRY(d, cudaEventCreateWithFlags(&c->check_copied, cudaEventDisableTiming));
    int64_t mb = ts_env_int(TS_ENV_CUDA_CACHE_MB); /* -1: unbounded */
    size_t limit = mb >= 0 ? (size_t)mb << 20 : SIZE_MAX;
    ts__cache_init(&c->cache, raw_alloc, raw_free, c, limit);
    d->stream = ts__stream_new(d->name, 1);
    if (!d->stream) return ts__error_prefix(TS_ERR_NOMEM, "%s: its worker", d->name);
    d->k_ew = &ts_cuda_kernels_ew;
    d->k_blas = &ts_cuda_kernels_blas;
    d->k_spatial = &ts_cuda_kernels_spatial;
    d->k_misc = &ts_cuda_kernels_misc;
    d->k_optim = &ts_cuda_kernels_optim;
    d->k_norm = &ts_cuda_kernels_norm;
    d->k_image = &ts_cuda_kernels_image;
    *out = d;
    return TS_OK;
}

void ts__cuda_device_describe(const ts_device *d, char *buf, size_t len) {
    const struct cudaDeviceProp *p = &ts__cuda(d)->prop;
    snprintf(buf, len, "%s, %.1f GiB, compute capability %d.%d, %d multiprocessors", p->name,
             (double)p->totalGlobalMem / (1 << 30), p->major, p->minor, p->multiProcessorCount);
}

ts__cache_stats ts__cuda_cache_stats(ts_device *d) { return ts__cache_get_stats(&ts__cuda(d)->cache); }

#endif /* TS_HAVE_CUDA */
