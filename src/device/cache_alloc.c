/*
 * device/cache_alloc.c — the size-binned caching allocator (cache_alloc.h).
 */
#include "device/cache_alloc.h"

struct ts__cache_node {
    ts__cache_node *next; /* next block of the same bin, or the next bin's list head in the chain */
    void *p;
    size_t size;
};

#define NBINS (sizeof(((ts__cache_alloc *)0)->bins) / sizeof(((ts__cache_alloc *)0)->bins[0]))

size_t ts__cache_bin(size_t nbytes) {
    if (nbytes <= 512) return 512;
    if (nbytes <= ((size_t)1 << 20)) return (nbytes + 511) & ~(size_t)511;
    size_t pow2 = (size_t)1 << 20;
    while (pow2 < nbytes) pow2 <<= 1; /* nbytes in (pow2 / 2, pow2] */
    size_t step = pow2 / 16;          /* eighths of the lower power: (pow2 / 2) / 8 */
    return (nbytes + step - 1) / step * step;
}

static size_t slot_of(size_t size) { return (size_t)((size / 512) * 0x9e3779b97f4a7c15ULL >> 56) % NBINS; }

void ts__cache_init(ts__cache_alloc *c, void *(*raw_alloc)(void *, size_t), void (*raw_free)(void *, void *),
                    void *ctx, size_t limit) {
    memset(c, 0, sizeof *c);
    pthread_mutex_init(&c->mu, NULL);
    c->raw_alloc = raw_alloc;
    c->raw_free = raw_free;
    c->ctx = ctx;
    c->limit = limit;
}

/* Removes and returns a cached block of exactly `size` bytes, or NULL. Lock held. */
static ts__cache_node *take_locked(ts__cache_alloc *c, size_t size) {
    ts__cache_node **pp = &c->bins[slot_of(size)];
    for (; *pp; pp = &(*pp)->next) {
        if ((*pp)->size == size) {
            ts__cache_node *n = *pp;
            *pp = n->next;
            return n;
        }
    }
    return NULL;
}

static void *raw_get_locked(ts__cache_alloc *c, size_t size) {
    void *p = c->raw_alloc(c->ctx, size);
    if (p) {
        c->st.raw_allocs++;
        c->st.reserved += size;
        if (c->st.reserved > c->st.peak_reserved) c->st.peak_reserved = c->st.reserved;
    }
    return p;
}

static void empty_locked(ts__cache_alloc *c) {
    for (size_t i = 0; i < NBINS; i++) {
        while (c->bins[i]) {
            ts__cache_node *n = c->bins[i];
            c->bins[i] = n->next;
            c->raw_free(c->ctx, n->p);
            c->st.raw_frees++;
            c->st.reserved -= n->size;
            c->st.cached -= n->size;
            free(n);
        }
    }
}

void *ts__cache_get(ts__cache_alloc *c, size_t nbytes) {
    size_t size = ts__cache_bin(nbytes);
    pthread_mutex_lock(&c->mu);
    ts__cache_node *n = take_locked(c, size);
    void *p = NULL;
    if (n) {
        p = n->p;
        c->st.cached -= size;
        c->st.hits++;
        free(n);
    } else {
        p = raw_get_locked(c, size);
        if (!p && c->st.cached) { /* out of memory: hand the cached blocks back and try once more */
            c->st.retries++;
            empty_locked(c);
            p = raw_get_locked(c, size);
        }
    }
    pthread_mutex_unlock(&c->mu);
    return p;
}

void ts__cache_put(ts__cache_alloc *c, void *p, size_t nbytes) {
    if (!p) return;
    size_t size = ts__cache_bin(nbytes);
    pthread_mutex_lock(&c->mu);
    ts__cache_node *n = NULL;
    if (c->st.cached + size <= c->limit) n = malloc(sizeof *n);
    if (n) {
        n->p = p;
        n->size = size;
        size_t s = slot_of(size);
        n->next = c->bins[s];
        c->bins[s] = n;
        c->st.cached += size;
    } else {
        c->raw_free(c->ctx, p);
        c->st.raw_frees++;
        c->st.reserved -= size;
    }
    pthread_mutex_unlock(&c->mu);
}

void ts__cache_empty(ts__cache_alloc *c) {
    pthread_mutex_lock(&c->mu);
    empty_locked(c);
    pthread_mutex_unlock(&c->mu);
}

ts__cache_stats ts__cache_get_stats(ts__cache_alloc *c) {
    pthread_mutex_lock(&c->mu);
    ts__cache_stats s = c->st;
    pthread_mutex_unlock(&c->mu);
    return s;
}
