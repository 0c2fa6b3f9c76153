/*
 * distributed/store_memory.c — the in-memory store: a ts__kv behind a mutex, with a
 * condition variable (CLOCK_MONOTONIC) that get/wait sleep on until a set or
 * add arrives or the timeout passes. Shared by the threads of one process
 * (ranks-as-threads tests, gloo's HashStore).
 */
#include "distributed/store.h"

#include <errno.h>
#include <pthread.h>
#include <time.h>

typedef struct mem_store {
    ts_store base;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    ts__kv kv;
} mem_store;

static struct timespec deadline_ts(double timeout_s) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    if (timeout_s > 1e9) timeout_s = 1e9;
    double sec = (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec + timeout_s;
    ts.tv_sec = (time_t)sec;
    ts.tv_nsec = (long)((sec - (double)ts.tv_sec) * 1e9);
    if (ts.tv_nsec >= 1000000000L) ts.tv_nsec = 999999999L;
    return ts;
}

static ts_status mem_set(ts_store *s, const char *key, const void *value, size_t len, double timeout_s) {
    mem_store *m = (mem_store *)s;
    pthread_mutex_lock(&m->mu);
    ts_status st = ts__kv_set(&m->kv, key, value, len);
    pthread_cond_broadcast(&m->cv);
    pthread_mutex_unlock(&m->mu);
    return st;
}

/* Waits (mu held) until every key exists; *missing gets the first absent key on timeout. */
static ts_status mem_wait_locked(mem_store *m, const char *const *keys, int nkeys, double timeout_s,
                                 const char **missing) {
    struct timespec dl = deadline_ts(timeout_s);
    for (;;) {
        int i = 0;
        while (i < nkeys && ts__kv_find(&m->kv, keys[i])) i++;
        if (i == nkeys) return TS_OK;
        *missing = keys[i];
        int rc = pthread_cond_timedwait(&m->cv, &m->mu, &dl);
        if (rc == ETIMEDOUT) {
            while (i < nkeys && ts__kv_find(&m->kv, keys[i])) i++;
            if (i == nkeys) return TS_OK;
            *missing = keys[i];
            return TS_ERR_TIMEOUT;
        }
    }
}

static ts_status mem_get(ts_store *s, const char *key, double timeout_s, void **value, size_t *len) {
    mem_store *m = (mem_store *)s;
    const char *missing = key;
    pthread_mutex_lock(&m->mu);
    ts_status st = mem_wait_locked(m, &key, 1, timeout_s, &missing);
    if (st == TS_OK) st = ts__kv_copy_value(ts__kv_find(&m->kv, key), value, len);
    pthread_mutex_unlock(&m->mu);
    if (st == TS_ERR_TIMEOUT)
        return ts_error(st, "memory store: timed out after %.3g s waiting for key '%s'", timeout_s, key);
    return st;
}

static ts_status mem_add(ts_store *s, const char *key, int64_t delta, double timeout_s, int64_t *result) {
    mem_store *m = (mem_store *)s;
    pthread_mutex_lock(&m->mu);
    ts_status st = ts__kv_add(&m->kv, key, delta, result);
    pthread_cond_broadcast(&m->cv);
    pthread_mutex_unlock(&m->mu);
    return st;
}

static ts_status mem_wait(ts_store *s, const char *const *keys, int nkeys, double timeout_s) {
    mem_store *m = (mem_store *)s;
    const char *missing = keys[0];
    pthread_mutex_lock(&m->mu);
    ts_status st = mem_wait_locked(m, keys, nkeys, timeout_s, &missing);
    pthread_mutex_unlock(&m->mu);
    if (st == TS_ERR_TIMEOUT)
        return ts_error(st, "memory store: timed out after %.3g s waiting for key '%s'", timeout_s, missing);
    return st;
}

static ts_status mem_check(ts_store *s, const char *key, double timeout_s, bool *exists) {
    mem_store *m = (mem_store *)s;
    pthread_mutex_lock(&m->mu);
    *exists = ts__kv_find(&m->kv, key) != NULL;
    pthread_mutex_unlock(&m->mu);
    return TS_OK;
}

static void mem_destroy(ts_store *s) {
    mem_store *m = (mem_store *)s;
    ts__kv_free(&m->kv);
    pthread_cond_destroy(&m->cv);
    pthread_mutex_destroy(&m->mu);
    free(m);
}

static const ts_store_vtable mem_vtable = {"memory", mem_set, mem_get, mem_add, mem_wait, mem_check, NULL,
                                           mem_destroy};

ts_status ts_store_memory_new(ts_store **out) {
    TS_ARG(out, "ts_store_memory_new: NULL argument");
    *out = NULL;
    mem_store *m = ts__calloc(1, sizeof *m);
    if (!m) return TS_ERR_NOMEM;
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    int rc = pthread_cond_init(&m->cv, &ca);
    pthread_condattr_destroy(&ca);
    if (rc != 0) {
        free(m);
        return ts_error(TS_ERR_INTERNAL, "memory store: pthread_cond_init failed (%d)", rc);
    }
    pthread_mutex_init(&m->mu, NULL);
    m->kv = TS__KV_INIT;
    ts__store_init(&m->base, &mem_vtable, TS_DIST_DEFAULT_TIMEOUT_S);
    *out = &m->base;
    return TS_OK;
}
