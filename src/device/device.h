/*
 * device/device.h — the device table. A device is a name, an allocator and
 * copy functions, plus one kernel table per op family. The op layer
 * (src/ops/NAME.c) checks arguments, allocates results on the inputs' device and
 * calls dev->k_<family>->fn(...); it never asks what kind of device it is.
 *
 * Kernel families are declared as incomplete structs here and defined by their
 * op family's header (src/device/k_<family>.h); each backend provides one
 * instance per family (src/ops/cpu/<family>.c for the CPU).
 */
#ifndef TS_DEVICE_H
#define TS_DEVICE_H

#include "core/internal.h"

#include <pthread.h>
#include <stdatomic.h>

struct ts_kernels_ew;      /* src/device/k_ew.h: elementwise, reductions, copies */
struct ts_kernels_blas;    /* src/device/k_blas.h: gemm */
struct ts_kernels_spatial; /* src/device/k_spatial.h: conv2d, pooling, batchnorm */
struct ts_kernels_misc;    /* src/device/k_misc.h: embedding, concat/slice, dropout, softmax, losses */
struct ts_kernels_optim;   /* src/device/k_optim.h: fused optimizer updates */
struct ts_kernels_norm;    /* src/device/k_norm.h: layer norm, group norm */
struct ts_kernels_image;   /* src/device/k_image.h: JPEG decoding + resampling on the device (NULL: none) */

typedef struct ts__stream ts__stream; /* device/stream.c */

typedef struct ts_device_ops {
    /* Returns device memory of at least nbytes (64-byte aligned) or NULL. */
    void *(*alloc)(ts_device *d, size_t nbytes);
    void (*free)(ts_device *d, void *p, size_t nbytes);
    ts_status (*copy_h2d)(ts_device *d, void *dst, const void *src, size_t n);
    ts_status (*copy_d2h)(ts_device *d, void *dst, const void *src, size_t n);
    ts_status (*copy_d2d)(ts_device *d, void *dst, const void *src, size_t n);
    ts_status (*memset0)(ts_device *d, void *dst, size_t n);
    ts_status (*synchronize)(ts_device *d);
    void (*empty_cache)(ts_device *d);
    /* Bytes held from the system, live and cached (NULL: the live bytes). */
    size_t (*reserved)(const ts_device *d);
    /* Pinned host memory (page-locked: the device copies it without staging, asynchronously), for the
     * input pipeline's staging buffers; NULL for devices whose memory is the host's (and then the three
     * below are NULL too). host_alloc returns NULL when the memory cannot be had (use malloc then). */
    void *(*host_alloc)(ts_device *d, size_t nbytes);
    void (*host_free)(ts_device *d, void *p);
    /* Queues a copy from pinned host memory src (host_alloc) to device memory dst after the work queued
     * so far, without waiting; done (may be NULL) receives a marker of its completion (the host must not
     * write src before it has waited for it). */
    ts_status (*copy_h2d_async)(ts_device *d, void *dst, const void *src, size_t n, void **done);
    /* Markers (CUDA: events) order work the device queues apart from its stream (a decoder's stream) against
     * it: marker_record gives one after the work queued so far; host_wait waits for one on the host,
     * device_wait makes the work queued after it wait (neither blocks the other's caller), marker_free
     * drops one; the three release it. NULL where all work is in order anyway (the CPU devices). */
    ts_status (*marker_record)(ts_device *d, void **marker);
    ts_status (*host_wait)(ts_device *d, void *marker);
    ts_status (*device_wait)(ts_device *d, void *marker);
    void (*marker_free)(ts_device *d, void *marker);
    /* Copies n bytes from src on device `from` (another device with the same ops table) to dst on d
     * without a trip through host memory, ordered after the work queued on both devices so far and before
     * what either queues later (CUDA: cudaMemcpyPeerAsync between two GPUs); NULL: through the host. */
    ts_status (*copy_peer)(ts_device *d, void *dst, ts_device *from, const void *src, size_t n);
} ts_device_ops;

struct ts_device {
    char name[32];
    ts_device_type type;
    int index;
    bool host_accessible; /* memory is addressable by the CPU */
    const ts_device_ops *ops;
    void *ctx; /* backend state */
    ts__stream *stream; /* the worker that runs submitted tasks; NULL: inline (the host "cpu") */

    const struct ts_kernels_ew *k_ew;
    const struct ts_kernels_blas *k_blas;
    const struct ts_kernels_spatial *k_spatial;
    const struct ts_kernels_misc *k_misc;
    const struct ts_kernels_optim *k_optim;
    const struct ts_kernels_norm *k_norm;
    const struct ts_kernels_image *k_image; /* NULL where images are decoded on the host only */

    /* memory accounting (bytes handed to live storages) */
    _Atomic size_t mem_allocated;
    _Atomic size_t mem_peak;
};

/* Registers a device (the registry keeps the pointer; the device must outlive
 * the process). Fails if the name is taken. */
ts_status ts__device_register(ts_device *d);

/* Allocation through the device, with accounting and an error naming the device. */
void *ts__device_alloc(ts_device *d, size_t nbytes);
void ts__device_free(ts_device *d, void *p, size_t nbytes);

/* The CPU device's setup (device/cpu.c); the registry registers it. */
ts_device *ts__cpu_device_init(void);
/* Sets up virtual CPU device cpu:<index> (device/cpu.c), with a stream whose
 * kernels use `threads` threads; the registry registers it. */
ts_status ts__cpu_virtual_device_new(int index, int threads, ts_device **out);

/* Streams (device/stream.c). */
ts__stream *ts__stream_new(const char *device_name, int threads);
ts_status ts__stream_synchronize(ts__stream *s);

#endif /* TS_DEVICE_H */
