/*
 * distributed/store.h — the rendezvous store's internal interface (gloo's design): a
 * tiny key-value table behind a vtable, with TCP (store_tcp.c), file
 * (store_file.c), in-memory (store_memory.c) and prefix (store_prefix.c)
 * implementations, and a client of PyTorch's TCPStore (store_torch.c). store.c holds the public ts_store_* dispatch, the refcount,
 * and a small hash map (ts__kv) that the implementations share.
 *
 * Semantics every implementation follows:
 *   - keys are NUL-terminated strings; values are byte strings of any length;
 *   - add treats the value as a decimal int64 (absent: 0) and stores the new
 *     value back as decimal text, so get("counter") reads e.g. "3";
 *   - get and wait block until the key(s) exist or timeout_s passes
 *     (TS_ERR_TIMEOUT naming the key); set/add/check never wait for keys but
 *     still bound their I/O by timeout_s;
 *   - every operation receives its timeout explicitly: the dispatch passes the
 *     store's own timeout, a prefix store passes its own to its base.
 * Not installed; not part of the public API.
 */
#ifndef TS_DIST_STORE_H
#define TS_DIST_STORE_H

#include "core/internal.h"
#include "distributed/auth.h"
#include "tessera/dist.h"

#include <stdatomic.h>

typedef struct ts_store_vtable {
    const char *kind; /* "tcp", "file", "memory", "prefix", "torch" */
    /* Copies value (len bytes) into the store under key. */
    ts_status (*set)(ts_store *s, const char *key, const void *value, size_t len, double timeout_s);
    /* Waits for key; *value is malloc'd with a NUL past len (caller frees). */
    ts_status (*get)(ts_store *s, const char *key, double timeout_s, void **value, size_t *len);
    ts_status (*add)(ts_store *s, const char *key, int64_t delta, double timeout_s, int64_t *result);
    /* Waits until all keys exist; TS_ERR_TIMEOUT naming the first missing one. */
    ts_status (*wait)(ts_store *s, const char *const *keys, int nkeys, double timeout_s);
    ts_status (*check)(ts_store *s, const char *key, double timeout_s, bool *exists);
    /* Optional: told after the store's timeout changed. */
    void (*set_timeout)(ts_store *s, double timeout_s);
    /* Frees the implementation (called when the last reference goes). */
    void (*destroy)(ts_store *s);
} ts_store_vtable;

/* The common head of every implementation's struct (first member). */
struct ts_store {
    const ts_store_vtable *vt;
    atomic_int refs;
    _Atomic double timeout_s; /* > 0 */
};

/* Sets up the head: one reference; timeout_s <= 0 means TS_DIST_DEFAULT_TIMEOUT_S. */
void ts__store_init(ts_store *s, const ts_store_vtable *vt, double timeout_s);
/* The store's current timeout in seconds. */
double ts__store_timeout(const ts_store *s);
/* "tcp", "file", "memory", "prefix" or "torch". */
const char *ts__store_kind(const ts_store *s);
/* ts_store_get with an explicit timeout (timeout_s < 0: the store's). */
ts_status ts__store_get_timeout(ts_store *s, const char *key, double timeout_s, void **value, size_t *len);

/* The store a prefix store forwards to (borrowed), or NULL when s is not a prefix store. */
ts_store *ts__store_prefix_inner(ts_store *s);
/* When s is (through prefix stores) a TCP store: its job authentication and the
 * numeric local address of its connection to the server (the interface that
 * reaches rank 0), and true; else false and nothing written. */
bool ts__store_tcp_job(ts_store *s, ts__auth *auth, char *local_ip, size_t cap);

/* Sleeps for the given number of seconds (<= 0: returns at once). */
void ts__sleep_s(double seconds);

/* ---- ts__kv: a string-keyed hash map of byte values ---------------------------------------- */
typedef struct ts__kv_entry {
    char *key;
    uint8_t *value; /* len bytes + a NUL */
    size_t len;
    struct ts__kv_entry *next;
} ts__kv_entry;

typedef struct ts__kv {
    ts__kv_entry **buckets;
    size_t nbuckets, n;
} ts__kv;

#define TS__KV_INIT ((ts__kv){NULL, 0, 0})

/* The entry for key, or NULL. */
ts__kv_entry *ts__kv_find(const ts__kv *m, const char *key);
/* Copies key and value in (replacing any old value). */
ts_status ts__kv_set(ts__kv *m, const char *key, const void *value, size_t len);
/* Adds delta to the decimal integer at key (absent: 0); TS_ERR_INVALID_ARG if the
 * value is not an integer or the sum overflows. */
ts_status ts__kv_add(ts__kv *m, const char *key, int64_t delta, int64_t *result);
/* Parses a counter value (decimal int64, optional sign); error names key. */
ts_status ts__kv_parse_int(const void *value, size_t len, const char *key, int64_t *out);
/* delta added to cur, or TS_ERR_INVALID_ARG naming key on overflow. */
ts_status ts__kv_sum(int64_t cur, int64_t delta, const char *key, int64_t *out);
/* A malloc'd copy of the entry's value with a trailing NUL. */
ts_status ts__kv_copy_value(const ts__kv_entry *e, void **value, size_t *len);
void ts__kv_free(ts__kv *m);

#endif /* TS_DIST_STORE_H */
