/*
 * distributed/store.c — the public ts_store_* calls: argument checks, the refcount,
 * and dispatch through the store's vtable (store.h); plus ts__kv, the hash map
 * the memory store, the file store's cache and the TCP server keep keys in.
 */
#include "distributed/store.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <time.h>

/* ---- head, refcount, dispatch ----------------------------------------------------------------- */

void ts__store_init(ts_store *s, const ts_store_vtable *vt, double timeout_s) {
    s->vt = vt;
    atomic_init(&s->refs, 1);
    atomic_init(&s->timeout_s, timeout_s > 0 ? timeout_s : TS_DIST_DEFAULT_TIMEOUT_S);
}

double ts__store_timeout(const ts_store *s) { return atomic_load(&((ts_store *)s)->timeout_s); }

const char *ts__store_kind(const ts_store *s) { return s ? s->vt->kind : "(null)"; }

ts_store *ts_store_retain(ts_store *s) {
    if (s) atomic_fetch_add(&s->refs, 1);
    return s;
}

void ts_store_release(ts_store *s) {
    if (!s) return;
    if (atomic_fetch_sub(&s->refs, 1) == 1) s->vt->destroy(s);
}

void ts_store_set_timeout(ts_store *s, double timeout_s) {
    if (!s) return;
    if (!(timeout_s > 0)) timeout_s = TS_DIST_DEFAULT_TIMEOUT_S;
    atomic_store(&s->timeout_s, timeout_s);
    if (s->vt->set_timeout) s->vt->set_timeout(s, timeout_s);
}

ts_status ts_store_set(ts_store *s, const char *key, const void *value, size_t len) {
    TS_ARG(s && key && (value || len == 0), "ts_store_set: NULL argument");
    return s->vt->set(s, key, value, len, ts__store_timeout(s));
}

ts_status ts__store_get_timeout(ts_store *s, const char *key, double timeout_s, void **value, size_t *len) {
    TS_ARG(s && key && value && len, "ts_store_get: NULL argument");
    *value = NULL;
    *len = 0;
    return s->vt->get(s, key, timeout_s < 0 ? ts__store_timeout(s) : timeout_s, value, len);
}

ts_status ts_store_get(ts_store *s, const char *key, void **value, size_t *len) {
    return ts__store_get_timeout(s, key, -1.0, value, len);
}

ts_status ts_store_add(ts_store *s, const char *key, int64_t delta, int64_t *result) {
    TS_ARG(s && key, "ts_store_add: NULL argument");
    int64_t r = 0;
    TS_TRY(s->vt->add(s, key, delta, ts__store_timeout(s), &r));
    if (result) *result = r;
    return TS_OK;
}

ts_status ts_store_wait(ts_store *s, const char *const *keys, int nkeys, double timeout_s) {
    TS_ARG(s && nkeys >= 0 && (keys || nkeys == 0), "ts_store_wait: NULL store or keys, or nkeys < 0");
    for (int i = 0; i < nkeys; i++) TS_ARG(keys[i], "ts_store_wait: keys[%d] is NULL", i);
    if (nkeys == 0) return TS_OK;
    return s->vt->wait(s, keys, nkeys, timeout_s < 0 ? ts__store_timeout(s) : timeout_s);
}

ts_status ts_store_check(ts_store *s, const char *key, bool *exists) {
    TS_ARG(s && key && exists, "ts_store_check: NULL argument");
    return s->vt->check(s, key, ts__store_timeout(s), exists);
}

void ts__sleep_s(double seconds) {
    if (!(seconds > 0)) return;
    struct timespec ts;
    ts.tv_sec = (time_t)seconds;
    ts.tv_nsec = (long)((seconds - (double)ts.tv_sec) * 1e9);
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* ---- ts__kv ------------------------------------------------------------------------------------ */

static uint64_t kv_hash(const char *key) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (const unsigned char *p = (const unsigned char *)key; *p; p++) h = (h ^ *p) * 1099511628211ull;
    return h;
}

ts__kv_entry *ts__kv_find(const ts__kv *m, const char *key) {
    if (!m->nbuckets) return NULL;
    for (ts__kv_entry *e = m->buckets[kv_hash(key) & (m->nbuckets - 1)]; e; e = e->next)
        if (strcmp(e->key, key) == 0) return e;
    return NULL;
}

static ts_status kv_grow(ts__kv *m) {
    size_t nb = m->nbuckets ? m->nbuckets * 2 : 64;
    ts__kv_entry **b = ts__calloc(nb, sizeof *b);
    if (!b) return TS_ERR_NOMEM;
    for (size_t i = 0; i < m->nbuckets; i++) {
        ts__kv_entry *e = m->buckets[i];
        while (e) {
            ts__kv_entry *next = e->next;
            size_t j = kv_hash(e->key) & (nb - 1);
            e->next = b[j];
            b[j] = e;
            e = next;
        }
    }
    free(m->buckets);
    m->buckets = b;
    m->nbuckets = nb;
    return TS_OK;
}

ts_status ts__kv_set(ts__kv *m, const char *key, const void *value, size_t len) {
    uint8_t *v = ts__malloc(len + 1);
    if (!v) return TS_ERR_NOMEM;
    if (len) memcpy(v, value, len);
    v[len] = 0;
    ts__kv_entry *e = ts__kv_find(m, key);
    if (e) {
        free(e->value);
        e->value = v;
        e->len = len;
        return TS_OK;
    }
    if (!m->nbuckets || m->n + 1 > m->nbuckets / 4 * 3) { /* load factor 0.75 */
        ts_status st = kv_grow(m);
        if (st != TS_OK) {
            free(v);
            return st;
        }
    }
    e = ts__malloc(sizeof *e);
    char *k = ts__strdup(key);
    if (!e || !k) {
        free(e);
        free(k);
        free(v);
        return TS_ERR_NOMEM;
    }
    e->key = k;
    e->value = v;
    e->len = len;
    size_t j = kv_hash(key) & (m->nbuckets - 1);
    e->next = m->buckets[j];
    m->buckets[j] = e;
    m->n++;
    return TS_OK;
}

ts_status ts__kv_parse_int(const void *value, size_t len, const char *key, int64_t *out) {
    const char *p = value;
    size_t i = 0;
    bool neg = false;
    if (i < len && (p[i] == '-' || p[i] == '+')) neg = p[i++] == '-';
    if (i == len) goto bad;
    uint64_t v = 0, lim = neg ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX;
    for (; i < len; i++) {
        if (p[i] < '0' || p[i] > '9') goto bad;
        unsigned d = (unsigned)(p[i] - '0');
        if (v > (lim - d) / 10) goto bad;
        v = v * 10 + d;
    }
    *out = neg ? (int64_t)(0 - v) : (int64_t)v;
    return TS_OK;
bad:
    return ts_error(TS_ERR_INVALID_ARG, "store: add on key '%s', whose value ('%.*s') is not an int64 counter", key,
                    (int)TS_MIN(len, (size_t)40), p);
}

ts_status ts__kv_sum(int64_t cur, int64_t delta, const char *key, int64_t *out) {
    if ((delta > 0 && cur > INT64_MAX - delta) || (delta < 0 && cur < INT64_MIN - delta))
        return ts_error(TS_ERR_INVALID_ARG, "store: add of %" PRId64 " to key '%s' (%" PRId64 ") overflows int64",
                        delta, key, cur);
    *out = cur + delta;
    return TS_OK;
}

ts_status ts__kv_add(ts__kv *m, const char *key, int64_t delta, int64_t *result) {
    int64_t cur = 0, next;
    ts__kv_entry *e = ts__kv_find(m, key);
    if (e) TS_TRY(ts__kv_parse_int(e->value, e->len, key, &cur));
    TS_TRY(ts__kv_sum(cur, delta, key, &next));
    char buf[32];
    int n = snprintf(buf, sizeof buf, "%" PRId64, next);
    TS_TRY(ts__kv_set(m, key, buf, (size_t)n));
    *result = next;
    return TS_OK;
}

ts_status ts__kv_copy_value(const ts__kv_entry *e, void **value, size_t *len) {
    uint8_t *v = ts__malloc(e->len + 1);
    if (!v) return TS_ERR_NOMEM;
    memcpy(v, e->value, e->len + 1);
    *value = v;
    *len = e->len;
    return TS_OK;
}

void ts__kv_free(ts__kv *m) {
    for (size_t i = 0; i < m->nbuckets; i++) {
        ts__kv_entry *e = m->buckets[i];
        while (e) {
            ts__kv_entry *next = e->next;
            free(e->key);
            free(e->value);
            free(e);
            e = next;
        }
    }
    free(m->buckets);
    *m = TS__KV_INIT;
}
