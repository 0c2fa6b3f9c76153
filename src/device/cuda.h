/*
 * device/cuda.h — CUDA devices cuda:0 ... cuda:N-1 (device/cuda.c): what the
 * registry calls to create them and what their kernels (src/ops/cuda/) need
 * from them.
 *
 * A CUDA device is a ts_device whose memory is not host-accessible, whose
 * allocator is the caching one of device/cache_alloc.h over cudaMalloc, and
 * which owns one non-blocking CUDA stream: every kernel, library call and copy
 * for the device is queued there, in the order the host issues it, so the
 * allocator may reuse a freed block at once. The host waits only where it needs
 * a value (copies to host, losses' error checks, ts_device_synchronize). Each
 * device also has a worker thread (its ts__stream) for ts_device_submit, as the
 * virtual CPU devices do. Errors name the device and the CUDA call.
 */
#ifndef TS_DEVICE_CUDA_H
#define TS_DEVICE_CUDA_H

#include "device/device.h"

#define TS_MAX_CUDA_DEVICES 16 /* cuda:0 ... cuda:15; more GPUs than that are not used */

/* How many CUDA devices the driver reports (at most TS_MAX_CUDA_DEVICES); 0 with a reason in why (no driver, no GPU, a Tessera
 * built without CUDA). */
int ts__cuda_device_count(char *why, size_t why_len);
/* Creates the device cuda:<ordinal> (the registry registers it). */
ts_status ts__cuda_device_new(int ordinal, ts_device **out);
/* One line describing the device (name, memory, compute capability), for `tessera devices`. */
void ts__cuda_device_describe(const ts_device *d, char *buf, size_t len);

#ifdef TS_HAVE_CUDA
#include "device/cache_alloc.h"

#include <cuda_runtime.h>

typedef struct ts__cuda_ctx {
    int ordinal;
    cudaStream_t stream;
    struct cudaDeviceProp prop;
    ts__cache_alloc cache;
    pthread_mutex_t lib_mu; /* guards the library handles below (created on first use) */
    void *cublas;           /* cublasHandle_t (ops/cuda/blas.c) */
    void *cublas_ws;        /* its workspace */
    void *cudnn;            /* cudnnHandle_t (ops/cuda/spatial.c) */
} ts__cuda_ctx;

static inline ts__cuda_ctx *ts__cuda(const ts_device *d) { return (ts__cuda_ctx *)d->ctx; }

/* Makes d this thread's current CUDA device and gives its stream. */
ts_status ts__cuda_enter(ts_device *d, cudaStream_t *stream);
/* TS_OK for cudaSuccess, else an error "cuda:N: <call> failed: <CUDA's message>" (TS_ERR_DEVICE,
 * TS_ERR_NOMEM for cudaErrorMemoryAllocation). */
ts_status ts__cuda_status(const ts_device *d, cudaError_t e, const char *call);
#define TS_CUDA_TRY(d, call) TS_TRY(ts__cuda_status((d), (call), #call))
/* Process-wide cache limit (TS_CUDA_CACHE_MB, default unlimited) and statistics. */
ts__cache_stats ts__cuda_cache_stats(ts_device *d);
#endif

#endif /* TS_DEVICE_CUDA_H */
