/*
 * device/cuda.c — CUDA devices (see device/cuda.h): creation, the caching
 * allocator over cudaMalloc, copies and synchronisation on the device's stream.
 * Built into every Tessera; without TS_HAVE_CUDA it only says why there are no
 * CUDA devices. Like cpu.c this file only builds devices; device.c registers them.
 */
#include "device/cuda.h"

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
#include "device/k_optim.h"
#include "device/k_spatial.h"

static ts_device ts_cuda_devices[TS_MAX_CUDA_DEVICES];
static ts__cuda_ctx ts_cuda_ctxs[TS_MAX_CUDA_DEVICES];

ts_status ts__cuda_status(const ts_device *d, cudaError_t e, const char *call) {
    if (e == cudaSuccess) return TS_OK;
    (void)cudaGetLastError(); /* clear a sticky non-fatal error so the next call does not report it again */
    return ts_error(e == cudaErrorMemoryAllocation ? TS_ERR_NOMEM : TS_ERR_DEVICE, "%s: %s failed: %s (%s)",
                    d ? d->name : "cuda", call, cudaGetErrorString(e), cudaGetErrorName(e));
}

int ts__cuda_device_count(char *why, size_t why_len) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        snprintf(why, why_len, "no usable CUDA driver or GPU (cudaGetDeviceCount: %s)", cudaGetErrorString(e));
        (void)cudaGetLastError();
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

/* Host memory is pageable (any pointer a caller gives): the copy is queued on the device's stream and
 * waited for, so the caller may reuse its buffer, and reads after earlier queued kernels. */
static ts_status cuda_copy(ts_device *d, void *dst, const void *src, size_t n, enum cudaMemcpyKind kind,
                           bool wait) {
    if (!n) return TS_OK;
    cudaStream_t s;
    TS_TRY(ts__cuda_enter(d, &s));
    TS_CUDA_TRY(d, cudaMemcpyAsync(dst, src, n, kind, s));
    if (wait) TS_CUDA_TRY(d, cudaStreamSynchronize(s));
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
    TS_TRY(ts__stream_synchronize(d->stream)); /* tasks submitted to the device's worker */
    cudaStream_t s;
    TS_TRY(ts__cuda_enter(d, &s));
    TS_CUDA_TRY(d, cudaStreamSynchronize(s));
    return TS_OK;
}

static void cuda_empty_cache(ts_device *d) {
    if (cuda_sync(d) != TS_OK) return;
    ts__cache_empty(&ts__cuda(d)->cache);
}

static size_t cuda_reserved(const ts_device *d) { return ts__cache_get_stats(&ts__cuda(d)->cache).reserved; }

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
    const char *e = getenv("TS_CUDA_CACHE_MB");
    size_t limit = e && *e ? (size_t)atol(e) << 20 : SIZE_MAX;
    ts__cache_init(&c->cache, raw_alloc, raw_free, c, limit);
    d->stream = ts__stream_new(d->name, 1);
    if (!d->stream) return ts__error_prefix(TS_ERR_NOMEM, "%s: its worker", d->name);
    d->k_ew = &ts_cuda_kernels_ew;
    d->k_blas = &ts_cuda_kernels_blas;
    d->k_spatial = &ts_cuda_kernels_spatial;
    d->k_misc = &ts_cuda_kernels_misc;
    d->k_optim = &ts_cuda_kernels_optim;
    d->k_norm = &ts_cuda_kernels_norm;
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
