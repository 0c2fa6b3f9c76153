/*
 * distributed/store_prefix.c — the prefix store: every key becomes "prefix/key"
 * before it reaches the base store (retained), so process groups sharing one
 * store never see each other's keys. Its own timeout is passed to the base on
 * every call; setting it does not change the base's.
 */
#include "distributed/store.h"


typedef struct prefix_store {
    ts_store base;
    ts_store *inner;
    char *prefix;
    size_t plen;
} prefix_store;

/* "prefix/key", malloc'd. */
static char *full_key(const prefix_store *p, const char *key) {
    size_t kl = strlen(key);
    char *k = ts__malloc(p->plen + 1 + kl + 1);
    if (!k) return NULL;
    memcpy(k, p->prefix, p->plen);
    k[p->plen] = '/';
    memcpy(k + p->plen + 1, key, kl + 1);
    return k;
}

static ts_status prefix_set(ts_store *s, const char *key, const void *value, size_t len, double timeout_s) {
    prefix_store *p = (prefix_store *)s;
    char *k = full_key(p, key);
    if (!k) return TS_ERR_NOMEM;
    ts_status st = p->inner->vt->set(p->inner, k, value, len, timeout_s);
    free(k);
    return st;
}

static ts_status prefix_get(ts_store *s, const char *key, double timeout_s, void **value, size_t *len) {
    prefix_store *p = (prefix_store *)s;
    char *k = full_key(p, key);
    if (!k) return TS_ERR_NOMEM;
    ts_status st = p->inner->vt->get(p->inner, k, timeout_s, value, len);
    free(k);
    return st;
}

static ts_status prefix_add(ts_store *s, const char *key, int64_t delta, double timeout_s, int64_t *result) {
    prefix_store *p = (prefix_store *)s;
    char *k = full_key(p, key);
    if (!k) return TS_ERR_NOMEM;
    ts_status st = p->inner->vt->add(p->inner, k, delta, timeout_s, result);
    free(k);
    return st;
}

static ts_status prefix_wait(ts_store *s, const char *const *keys, int nkeys, double timeout_s) {
    prefix_store *p = (prefix_store *)s;
    char **ks = ts__calloc((size_t)nkeys, sizeof *ks);
    if (!ks) return TS_ERR_NOMEM;
    ts_status st = TS_OK;
    for (int i = 0; i < nkeys && st == TS_OK; i++)
        if (!(ks[i] = full_key(p, keys[i]))) st = TS_ERR_NOMEM;
    if (st == TS_OK) st = p->inner->vt->wait(p->inner, (const char *const *)ks, nkeys, timeout_s);
    for (int i = 0; i < nkeys; i++) free(ks[i]);
    free(ks);
    return st;
}

static ts_status prefix_check(ts_store *s, const char *key, double timeout_s, bool *exists) {
    prefix_store *p = (prefix_store *)s;
    char *k = full_key(p, key);
    if (!k) return TS_ERR_NOMEM;
    ts_status st = p->inner->vt->check(p->inner, k, timeout_s, exists);
    free(k);
    return st;
}

static void prefix_destroy(ts_store *s) {
    prefix_store *p = (prefix_store *)s;
    ts_store_release(p->inner);
    free(p->prefix);
    free(p);
}

static const ts_store_vtable prefix_vtable = {"prefix",    prefix_set,  prefix_get, prefix_add,
                                              prefix_wait, prefix_check, NULL,      prefix_destroy};

ts_status ts_store_prefix_new(ts_store *base, const char *prefix, ts_store **out) {
    TS_ARG(base && prefix && out, "ts_store_prefix_new: NULL argument");
    *out = NULL;
    prefix_store *p = ts__calloc(1, sizeof *p);
    if (!p) return TS_ERR_NOMEM;
    p->prefix = ts__strdup(prefix);
    if (!p->prefix) {
        free(p);
        return TS_ERR_NOMEM;
    }
    p->plen = strlen(prefix);
    p->inner = ts_store_retain(base);
    ts__store_init(&p->base, &prefix_vtable, ts__store_timeout(base));
    *out = &p->base;
    return TS_OK;
}

ts_store *ts__store_prefix_inner(ts_store *s) {
    return s && s->vt == &prefix_vtable ? ((prefix_store *)s)->inner : NULL;
}
