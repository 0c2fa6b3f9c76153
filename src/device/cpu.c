/*
 * device/cpu.c — the host CPU device: a caching allocator and memcpy copies.
 *
 * Allocator: training allocates the same sizes every step, so freed blocks are
 * kept on per-size free lists (sizes rounded up to 64 bytes, or to 4 KiB above
 * 64 KiB) and reused, which avoids mmap/munmap and page faults on every step.
 * The cache is bounded (TS_CPU_CACHE_MB, default 2048) and disabled in
 * sanitizer builds or with TS_CPU_CACHE_MB=0 so ASan sees every free. When the
 * system is out of memory, the cached blocks are freed and the allocation
 * tried once more.
 *
 * This file only builds devices; the registry (device.c) registers them, so
 * calls go one way, registry to backend.
 */
#include "core/env.h"
#include "device/device.h"
#include "device/k_blas.h"
#include "device/k_ew.h"
#include "device/k_misc.h"
#include "device/k_norm.h"
#include "device/k_optim.h"
#include "device/k_spatial.h"

#include <stdio.h>

typedef struct cpu_block {
    struct cpu_block *next;
} cpu_block;

#define CPU_NBUCKETS 1024 /* open-addressed table of size classes */

typedef struct cpu_cache {
    pthread_mutex_t mu;
    size_t sizes[CPU_NBUCKETS];
    cpu_block *heads[CPU_NBUCKETS];
    size_t cached_bytes, limit;
} cpu_cache;

static cpu_cache ts_cpu_cache;

static size_t round_size(size_t n) {
    if (n == 0) n = 1;
    if (n <= 65536) return (n + 63) & ~(size_t)63;
    return (n + 4095) & ~(size_t)4095;
}

static size_t bucket_of(cpu_cache *c, size_t sz, int create) {
    size_t h = (sz / 64) * 0x9e3779b97f4a7c15ULL % CPU_NBUCKETS;
    for (size_t i = 0; i < CPU_NBUCKETS; i++) {
        size_t j = (h + i) % CPU_NBUCKETS;
        if (c->sizes[j] == sz) return j;
        if (c->sizes[j] == 0) {
            if (!create) return (size_t)-1;
            c->sizes[j] = sz;
            return j;
        }
    }
    return (size_t)-1;
}

static void cpu_empty_cache(ts_device *d) {
    cpu_cache *c = d->ctx;
    pthread_mutex_lock(&c->mu);
    for (size_t i = 0; i < CPU_NBUCKETS; i++) {
        while (c->heads[i]) {
            cpu_block *b = c->heads[i];
            c->heads[i] = b->next;
            free(b);
        }
        c->sizes[i] = 0;
    }
    c->cached_bytes = 0;
    pthread_mutex_unlock(&c->mu);
}

static void *cpu_alloc(ts_device *d, size_t nbytes) {
    cpu_cache *c = d->ctx;
    size_t sz = round_size(nbytes);
    if (c->limit) {
        pthread_mutex_lock(&c->mu);
        size_t b = bucket_of(c, sz, 0);
        if (b != (size_t)-1 && c->heads[b]) {
            cpu_block *blk = c->heads[b];
            c->heads[b] = blk->next;
            c->cached_bytes -= sz;
            pthread_mutex_unlock(&c->mu);
            return blk;
        }
        pthread_mutex_unlock(&c->mu);
    }
    void *p = NULL;
    if (posix_memalign(&p, 64, sz) == 0) return p;
    /* out of memory: give the cached blocks back to the system and try once more */
    if (c->limit) {
        cpu_empty_cache(d);
        if (posix_memalign(&p, 64, sz) == 0) return p;
    }
    return NULL;
}

static void cpu_free(ts_device *d, void *p, size_t nbytes) {
    cpu_cache *c = d->ctx;
    size_t sz = round_size(nbytes);
    if (c->limit) {
        pthread_mutex_lock(&c->mu);
        if (c->cached_bytes + sz <= c->limit) {
            size_t b = bucket_of(c, sz, 1);
            if (b != (size_t)-1) {
                cpu_block *blk = p;
                blk->next = c->heads[b];
                c->heads[b] = blk;
                c->cached_bytes += sz;
                pthread_mutex_unlock(&c->mu);
                return;
            }
        }
        pthread_mutex_unlock(&c->mu);
    }
    free(p);
}

static ts_status cpu_copy(ts_device *d, void *dst, const void *src, size_t n) {
    if (n) memcpy(dst, src, n);
    return TS_OK;
}

static ts_status cpu_memset0(ts_device *d, void *dst, size_t n) {
    if (n) memset(dst, 0, n);
    return TS_OK;
}

static ts_status cpu_sync(ts_device *d) { return ts__stream_synchronize(d->stream); }

static const ts_device_ops cpu_ops = {
    .alloc = cpu_alloc,
    .free = cpu_free,
    .copy_h2d = cpu_copy,
    .copy_d2h = cpu_copy,
    .copy_d2d = cpu_copy,
    .memset0 = cpu_memset0,
    .synchronize = cpu_sync,
    .empty_cache = cpu_empty_cache,
};

static void cpu_device_setup(ts_device *d, const char *name, int index, cpu_cache *cache) {
    snprintf(d->name, sizeof d->name, "%s", name);
    d->type = TS_DEVICE_CPU;
    d->index = index;
    d->host_accessible = true;
    d->ops = &cpu_ops;
    d->ctx = cache;
    pthread_mutex_init(&cache->mu, NULL);
#ifdef TS_SANITIZE
    cache->limit = 0;
#else
    cache->limit = (size_t)ts_env_int(TS_ENV_CPU_CACHE_MB) << 20;
#endif
    d->k_ew = &ts_cpu_kernels_ew;
    d->k_blas = &ts_cpu_kernels_blas;
    d->k_spatial = &ts_cpu_kernels_spatial;
    d->k_misc = &ts_cpu_kernels_misc;
    d->k_optim = &ts_cpu_kernels_optim;
    d->k_norm = &ts_cpu_kernels_norm;
}

static ts_device ts_cpu_device;

ts_device *ts__cpu_device_init(void) {
    ts_device *d = &ts_cpu_device;
    cpu_device_setup(d, "cpu", -1, &ts_cpu_cache);
    return d;
}

/* Virtual CPU devices: the same kernels and allocator code as "cpu", but each
 * with its own cache (its own memory pool and accounting) and its own stream. */
static ts_device ts_vcpu_devices[TS_MAX_CPU_DEVICES];
static cpu_cache ts_vcpu_caches[TS_MAX_CPU_DEVICES];

ts_status ts__cpu_virtual_device_new(int index, int threads, ts_device **out) {
    TS_ARG(index >= 0 && index < TS_MAX_CPU_DEVICES, "virtual CPU device index %d out of range [0, %d)", index,
           TS_MAX_CPU_DEVICES);
    ts_device *d = &ts_vcpu_devices[index];
    char name[32];
    snprintf(name, sizeof name, "cpu:%d", index);
    cpu_device_setup(d, name, index, &ts_vcpu_caches[index]);
    d->stream = ts__stream_new(name, threads);
    if (!d->stream) return ts__error_prefix(TS_ERR_NOMEM, "virtual CPU device %s: its stream", name);
    *out = d;
    return TS_OK;
}
