/*
 * device/cache_alloc.h — a size-binned caching allocator over a raw allocator
 * that is slow or synchronising (cudaMalloc/cudaFree). Host-side bookkeeping
 * only: it never touches the memory it hands out, so the CPU tests exercise
 * it with malloc as the raw allocator (tests/test_cache_alloc.c).
 *
 * Sizes are rounded to a bin (ts__cache_bin: 512-byte steps up to 1 MiB, then
 * eighths of the enclosing power of two, so a block wastes at most 12.5%) and a
 * freed block waits on its bin's free list for the next request of that bin.
 * Blocks are never split or merged. Reuse is safe on a device with one stream:
 * work queued before the free runs before work queued after the reuse (the
 * rule PyTorch's allocator keeps per stream). Cached bytes are bounded by
 * `limit`; past it frees go back to the raw allocator. When the raw allocator
 * fails, every cached block is released and the allocation tried once more.
 */
#ifndef TS_CACHE_ALLOC_H
#define TS_CACHE_ALLOC_H

#include "core/internal.h"

#include <pthread.h>

typedef struct ts__cache_node ts__cache_node; /* one cached block (cache_alloc.c) */

typedef struct ts__cache_stats {
    size_t reserved;     /* bytes held from the raw allocator: live + cached */
    size_t cached;       /* bytes of blocks waiting on free lists */
    size_t peak_reserved;
    uint64_t raw_allocs, raw_frees, hits, retries; /* retries: raw failures answered by emptying the cache */
} ts__cache_stats;

typedef struct ts__cache_alloc {
    pthread_mutex_t mu;
    void *(*raw_alloc)(void *ctx, size_t nbytes); /* NULL on failure */
    void (*raw_free)(void *ctx, void *p);
    void *ctx;
    size_t limit; /* most bytes kept cached; 0 disables caching */
    ts__cache_node *bins[256]; /* hash of bin size -> list of cached blocks of that size */
    ts__cache_stats st;
} ts__cache_alloc;

/* The bin size a request of nbytes is served from (>= nbytes, >= 512). */
size_t ts__cache_bin(size_t nbytes);

void ts__cache_init(ts__cache_alloc *c, void *(*raw_alloc)(void *, size_t), void (*raw_free)(void *, void *),
                    void *ctx, size_t limit);
/* A block of at least nbytes (its bin's size), or NULL when the raw allocator fails twice. */
void *ts__cache_get(ts__cache_alloc *c, size_t nbytes);
/* Returns a block obtained with ts__cache_get(c, nbytes) (the same nbytes). */
void ts__cache_put(ts__cache_alloc *c, void *p, size_t nbytes);
/* Releases every cached block to the raw allocator (torch.cuda.empty_cache). */
void ts__cache_empty(ts__cache_alloc *c);
ts__cache_stats ts__cache_get_stats(ts__cache_alloc *c);

#endif
