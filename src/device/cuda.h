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
 * a value (copies to and from the host, the clip norm and the loss scaler's
 * found-inf, ts_device_synchronize). Each device also has a worker thread (its
 * ts__stream) for ts_device_submit, as the virtual CPU devices do. Errors name
 * the device and the CUDA call.
 *
 * Deferred index checks. embedding and cross_entropy validate their indices on
 * the device without waiting: their kernels keep the first bad index (position,
 * value, the op and its sizes) in the device's check record (ts_cu_bad_rec,
 * device/cuda_check.h), and after each such op a cudaMemcpyAsync copies the
 * record into a pinned host copy and an event marks that copy. The host looks
 * at the copy, never waiting for it, at the device's next synchronisation
 * (copies to and from the host, ts_device_synchronize) and at the start of the
 * next checking op, and reports a bad index there with the CPU's message plus
 * where it was found; the record is then cleared. Until the host has reported
 * one, later ops keep the first. As with PyTorch's device-side asserts, the
 * error surfaces after the op that caused it has returned TS_OK.
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
    void *nvjpeg;           /* nvjpegHandle_t (ops/cuda/image.c) */
    uint32_t peer_tried;    /* ordinals this device has asked for peer access to (device/cuda.c, cuda_peer) */
    /* the deferred index checks (above); created with the device and kept as long as it (the process) */
    pthread_mutex_t check_mu;  /* guards what follows; held from ts__cuda_check_begin to _end */
    void *check_dev;           /* the record in device memory (ts_cu_bad_rec) */
    void *check_host;          /* its pinned host copy (cudaHostAlloc), written by cudaMemcpyAsync */
    cudaEvent_t check_copied;  /* recorded after the latest copy to check_host */
    bool check_pending;        /* a copy was queued that the host has not looked at */
} ts__cuda_ctx;

static inline ts__cuda_ctx *ts__cuda(const ts_device *d) { return (ts__cuda_ctx *)d->ctx; }

/* Makes d this thread's current CUDA device and gives its stream. */
ts_status ts__cuda_enter(ts_device *d, cudaStream_t *stream);
/* TS_OK for cudaSuccess, else an error "cuda:N: <call> failed: <CUDA's message>" (TS_ERR_DEVICE,
 * TS_ERR_NOMEM for cudaErrorMemoryAllocation). */
ts_status ts__cuda_status(const ts_device *d, cudaError_t e, const char *call);
#define TS_CUDA_TRY(d, call) TS_TRY(ts__cuda_status((d), (call), #call))
/* An op that checks indices on the device (ops/cuda/misc.c) calls ts__cuda_check_begin before queuing
 * its kernels: it takes the device's check lock, reports an earlier op's bad index if the stream has
 * got past that op's copy (never waiting; the error clears the record, releases the lock and the op
 * should fail with it), and gives the device record the kernels write (ts_cu_bad_rec *). After TS_OK it
 * must call ts__cuda_check_end(d, s, st) with the status of queuing its kernels: if TS_OK, that queues
 * the copy to the host and the event; if not, it clears the record's running word (a kernel that was
 * queued may have set it); either way it releases the lock and returns st or the copy's error. */
ts_status ts__cuda_check_begin(ts_device *d, cudaStream_t s, void **rec);
ts_status ts__cuda_check_end(ts_device *d, cudaStream_t s, ts_status st);
/* Process-wide cache limit (TS_CUDA_CACHE_MB, default unlimited) and statistics. */
ts__cache_stats ts__cuda_cache_stats(ts_device *d);
#endif

#endif /* TS_DEVICE_CUDA_H */
