/*
 * distributed/store_torch.c — a client of PyTorch's TCPStore: the store torchrun's
 * agent serves on MASTER_PORT (TORCHELASTIC_USE_AGENT_STORE=True), or any
 * torch.distributed.TCPStore. Every rank is a client; nobody here serves.
 *
 * ---- wire protocol (torch/csrc/distributed/c10d: TCPStore.cpp's client,
 * TCPStoreBackend.hpp's QueryType, Utils.hpp's tcputil) ------------------------------------------
 * No framing: a request is a query byte and its arguments, a reply is bare
 * values, all little-endian. A string or byte vector is  u64 length | bytes.
 * Two generations of query numbers:
 *     torch >= 2.0   torch 1.x   query
 *     0                          VALIDATE  u32 0x3C85F7CE   no reply; must be a connection's first query
 *     1              0           SET       str key | bytes value             no reply
 *     3              2           GET       str key      bytes value (the key must exist: the server closes
 *                                                       the connection otherwise, 2.x's libuv answers empty)
 *     4              3           ADD       str key | i64 delta               i64 new value (stored as decimal text)
 *     5              4           CHECK     u64 n | n x str key               u8 0 READY (all exist) / 1 NOT_READY
 *     6              5           WAIT      u64 n | n x str key               u8 0 STOP_WAITING, once all exist
 *     7              6           GETNUMKEYS                                  i64 number of keys
 * The server reads a connection's queries in order and parks a WAIT without
 * blocking the queries after it, so a GET is sent only after its WAIT was
 * answered (as torch's client does). torch's client names every key "/" + key;
 * so do we, so that Python's store.get("k") sees our "k". Checked byte for byte
 * against torch 1.13's server (Debian 12's python3-torch) and 2.x's.
 *
 * ---- which generation: the first connection's probe ----------------------------------------------
 * A torch 1.x server reads each query whole with blocking reads on its one
 * thread, so a probe must never leave it waiting for bytes; a 2.x server closes
 * (classic) or ignores (libuv) a connection whose first query is not VALIDATE.
 * So the first connection sends, in one write,
 *     VALIDATE | GETNUMKEYS x 4 | CHECK "/tessera/hello"
 * A 2.x server answers 4 x i64 + one byte 0/1. A 1.x server reads SET with a
 * key length of 0x070707073C85F7CE bytes (the magic and four GETNUMKEYS bytes):
 * no allocation of that size can succeed, so it drops the connection at once
 * without waiting for more. Then a second connection sends 1.x's
 *     GETNUMKEYS | CHECK "/tessera/hello"
 * and a 1.x server answers i64 + one byte 0/1. Anything else (a Tessera TCP
 * store sends its own challenge first; a silent listener) is an error naming
 * host:port within the timeout. Later connections of a 2.x client open with
 * VALIDATE + CHECK; a 1.x client's need no opening.
 *
 * ---- this client --------------------------------------------------------------------------------
 * A pool of connections (threads sharing the store never queue behind a parked
 * WAIT). SET is followed by a CHECK of its key in the same write, so a set that
 * returns TS_OK is stored. Every send and receive is bounded by the call's
 * deadline; a connection that timed out or failed is closed, never reused
 * (closing drops a parked WAIT on the server). Keys up to 8 KiB and values up to
 * 8 MiB: 2.x's libuv server's limits, checked here first for both generations.
 */
#include "distributed/sock.h"
#include "distributed/store.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <unistd.h>

/* The queries, numbered apart from their codes; qcode[generation][query] is the byte on the wire. */
typedef enum torch_gen { GEN_2 = 0, GEN_1 = 1 } torch_gen; /* torch >= 2.0, torch 1.x */
typedef enum query { Q_VALIDATE, Q_SET, Q_GET, Q_ADD, Q_CHECK, Q_WAIT, Q_GETNUMKEYS, Q_COUNT } query;
static const int qcode[2][Q_COUNT] = {{0, 1, 3, 4, 5, 6, 7}, {-1, 0, 2, 3, 4, 5, 6}};
static const char *const gen_name[2] = {"torch >= 2.0", "torch 1.x"};
enum { CHECK_READY = 0, CHECK_NOT_READY = 1 };
enum { WAIT_STOP_WAITING = 0 };
#define VALIDATE_MAGIC 0x3C85F7CEu
#define PROBE_NUMKEYS 4        /* GETNUMKEYS after VALIDATE: a 1.x server's key length of 2^58 and more */
#define MAX_NUMKEYS (1ll << 31) /* a GETNUMKEYS answer above this is no TCPStore's */
#define MAX_KEY 8192u          /* with the "/" */
#define MAX_VALUE (8u << 20)   /* what we send */
#define MAX_REPLY (1ull << 30) /* what we accept back */
#define HELLO_KEY "tessera/hello"

/* ---- requests ------------------------------------------------------------------------------------- */

static void wb_q(ts__wbuf *b, torch_gen g, query q) { ts__wbuf_le(b, (uint64_t)qcode[g][q], 1); }

static void wb_bytes(ts__wbuf *b, const void *d, size_t n) {
    ts__wbuf_le(b, n, 8);
    ts__wbuf_put(b, d, n);
}

/* A key as torch's client sends it: "/" + key. */
static void wb_key(ts__wbuf *b, const char *key) {
    size_t n = strlen(key);
    ts__wbuf_le(b, n + 1, 8);
    ts__wbuf_put(b, "/", 1);
    ts__wbuf_put(b, key, n);
}

/* CHECK or WAIT of n keys. */
static void wb_keys(ts__wbuf *b, torch_gen g, query q, const char *const *keys, int n) {
    wb_q(b, g, q);
    ts__wbuf_le(b, (uint64_t)n, 8);
    for (int i = 0; i < n; i++) wb_key(b, keys[i]);
}

/* ---- the store ---------------------------------------------------------------------------------------- */

typedef struct torch_store {
    ts_store base;
    char host[256];
    char hp[300]; /* "host:port" for messages */
    int port;
    torch_gen gen;                /* the server's generation (fixed by the first connection) */
    bool probing;                 /* the first connection's probe runs */
    bool dropped_probe;           /* the server closed the connection on 2.x's probe (a 1.x server?) */
    struct sockaddr_storage addr; /* the address that answered */
    socklen_t addrlen;
    ts__sock_pool pool;
} torch_store;

static ts_status io_error(const torch_store *t, ts__io r, int err, double timeout_s, const char *what) {
    if (r == TS__IO_TIMEOUT)
        return ts_error(TS_ERR_TIMEOUT, "torch store %s: timed out after %.3g s %s", t->hp, timeout_s, what);
    if (r == TS__IO_CLOSED)
        return ts_error(TS_ERR_REMOTE, "torch store %s: the server closed the connection %s", t->hp, what);
    return ts_error(TS_ERR_REMOTE, "torch store %s: %s %s", t->hp, strerror(err), what);
}

/* The opening of a connection: the probe of the first one (see the top), VALIDATE + CHECK
 * on a 2.x server's later ones, nothing on a 1.x server's. */
static ts_status opening(torch_store *t, ts__wbuf *b, size_t *numkeys) {
    const char *hello = HELLO_KEY;
    *numkeys = 0;
    if (t->gen == GEN_2) {
        wb_q(b, GEN_2, Q_VALIDATE);
        ts__wbuf_le(b, VALIDATE_MAGIC, 4);
        for (int i = 0; t->probing && i < PROBE_NUMKEYS; i++) wb_q(b, GEN_2, Q_GETNUMKEYS);
        *numkeys = t->probing ? PROBE_NUMKEYS : 0;
    } else if (t->probing) {
        wb_q(b, GEN_1, Q_GETNUMKEYS);
        *numkeys = 1;
    } else {
        return TS_OK;
    }
    wb_keys(b, t->gen, Q_CHECK, &hello, 1);
    return b->oom ? ts_error(TS_ERR_NOMEM, "torch store: out of memory") : TS_OK;
}

/* Reads the opening's answers: numkeys x i64 in [0, 2^31), then one byte 0 or 1. */
static ts_status opening_answer(torch_store *t, int fd, size_t numkeys, double deadline, double timeout_s) {
    uint8_t ans[8 * PROBE_NUMKEYS + 1];
    size_t n = 8 * numkeys + 1;
    ts__io r = ts__sock_recv(fd, ans, n, deadline);
    int err = errno;
    if (r == TS__IO_TIMEOUT)
        return ts_error(TS_ERR_TIMEOUT,
                        "torch store %s: no answer within %.3g s to the opening queries of %s: is a PyTorch TCPStore "
                        "listening there (torchrun's agent store on MASTER_PORT)?",
                        t->hp, timeout_s, gen_name[t->gen]);
    if (r == TS__IO_CLOSED && t->probing && t->gen == GEN_2) {
        t->dropped_probe = true; /* perhaps a torch 1.x server: the caller tries its probe */
        return ts_error(TS_ERR_REMOTE, "torch store %s: the server closed the connection on VALIDATE", t->hp);
    }
    if (r == TS__IO_CLOSED)
        return ts_error(TS_ERR_REMOTE,
                        "torch store %s: the server closed the connection on the opening queries of both torch >= 2.0 "
                        "and torch 1.x: not a PyTorch TCPStore (or it refused this client)",
                        t->hp);
    if (r != TS__IO_OK) return io_error(t, r, err, timeout_s, "opening a connection");
    for (size_t i = 0; i < numkeys; i++) {
        int64_t k = (int64_t)ts__get_le(ans + 8 * i, 8);
        if (k < 0 || k >= MAX_NUMKEYS)
            return ts_error(TS_ERR_REMOTE, "torch store %s: answered GETNUMKEYS with %" PRId64 ": not a PyTorch "
                            "TCPStore (%s)", t->hp, k, gen_name[t->gen]);
    }
    uint8_t c = ans[8 * numkeys];
    if (c != CHECK_READY && c != CHECK_NOT_READY)
        return ts_error(TS_ERR_REMOTE, "torch store %s: answered CHECK with byte %u (expected 0 or 1): not a PyTorch "
                        "TCPStore (%s)", t->hp, c, gen_name[t->gen]);
    return TS_OK;
}

static ts_status handshake(torch_store *t, int fd, double deadline, double timeout_s) {
    ts__wbuf b = {0};
    size_t numkeys = 0;
    ts_status st = opening(t, &b, &numkeys);
    if (st == TS_OK && b.n) {
        ts__io r = ts__sock_send(fd, b.p, b.n, deadline);
        st = r == TS__IO_OK ? opening_answer(t, fd, numkeys, deadline, timeout_s)
                            : io_error(t, r, errno, timeout_s, "opening a connection");
    }
    free(b.p);
    return st;
}

static ts_status pool_take(torch_store *t, double deadline, double timeout_s, int *fd) {
    *fd = ts__sock_pool_take(&t->pool);
    if (*fd >= 0) return TS_OK;
    int err = 0;
    *fd = ts__sock_connect((const struct sockaddr *)&t->addr, t->addrlen, deadline, &err);
    if (*fd < 0) {
        if (err == ETIMEDOUT)
            return ts_error(TS_ERR_TIMEOUT, "torch store %s: timed out opening a connection to the server", t->hp);
        return ts_error(TS_ERR_REMOTE, "torch store %s: cannot reach the server: %s", t->hp, strerror(err));
    }
    ts_status st = handshake(t, *fd, deadline, timeout_s);
    if (st != TS_OK) {
        close(*fd);
        *fd = -1;
    }
    return st;
}

/* Sends req and reads n reply bytes into reply; with var, then a u64-length byte
 * vector (*var malloc'd with a NUL past *varlen). The connection goes back to the
 * pool only after a complete exchange. */
static ts_status call(torch_store *t, ts__wbuf *req, double timeout_s, const char *what, uint8_t *reply, size_t n,
                      uint8_t **var, size_t *varlen) {
    if (req->oom) return ts_error(TS_ERR_NOMEM, "torch store: out of memory building a request");
    double deadline = ts_time_now() + timeout_s;
    int fd;
    TS_TRY(pool_take(t, deadline, timeout_s, &fd));
    ts__io r = ts__sock_send(fd, req->p, req->n, deadline);
    int err = errno;
    if (r == TS__IO_OK && n) r = ts__sock_recv(fd, reply, n, deadline), err = errno;
    uint8_t *v = NULL;
    if (r == TS__IO_OK && var) {
        uint8_t lb[8];
        r = ts__sock_recv(fd, lb, 8, deadline), err = errno;
        uint64_t len = r == TS__IO_OK ? ts__get_le(lb, 8) : 0;
        if (r == TS__IO_OK && len > MAX_REPLY) {
            close(fd);
            return ts_error(TS_ERR_REMOTE, "torch store %s: a reply of %" PRIu64 " bytes %s: not a TCPStore reply",
                            t->hp, len, what);
        }
        if (r == TS__IO_OK) {
            v = ts__malloc((size_t)len + 1);
            if (!v) {
                close(fd);
                return TS_ERR_NOMEM;
            }
            r = ts__sock_recv(fd, v, (size_t)len, deadline), err = errno;
            v[len] = 0;
            *varlen = (size_t)len;
        }
    }
    if (r != TS__IO_OK) {
        close(fd);
        free(v);
        return io_error(t, r, err, timeout_s, what);
    }
    ts__sock_pool_put(&t->pool, fd);
    if (var) *var = v;
    return TS_OK;
}

static ts_status check_key(const torch_store *t, const char *key) {
    if (strlen(key) + 1 > MAX_KEY)
        return ts_error(TS_ERR_INVALID_ARG, "torch store %s: key '%.100s...' is %zu bytes; a TCPStore takes at most %u",
                        t->hp, key, strlen(key), MAX_KEY - 1);
    return TS_OK;
}

static ts_status torch_set(ts_store *s, const char *key, const void *value, size_t len, double timeout_s) {
    torch_store *t = (torch_store *)s;
    TS_TRY(check_key(t, key));
    if (len > MAX_VALUE)
        return ts_error(TS_ERR_INVALID_ARG,
                        "torch store %s: value of %zu bytes for key '%.200s' is over a TCPStore's 8 MiB limit", t->hp,
                        len, key);
    char what[300];
    snprintf(what, sizeof what, "setting key '%.200s'", key);
    ts__wbuf req = {0};
    wb_q(&req, t->gen, Q_SET);
    wb_key(&req, key);
    wb_bytes(&req, value, len);
    wb_keys(&req, t->gen, Q_CHECK, &key, 1); /* the set's confirmation */
    uint8_t ans = 0xff;
    ts_status st = call(t, &req, timeout_s, what, &ans, 1, NULL, NULL);
    free(req.p);
    TS_TRY(st);
    if (ans != CHECK_READY)
        return ts_error(TS_ERR_REMOTE, "torch store %s: key '%.200s' is not there right after setting it (answer %u)",
                        t->hp, key, ans);
    return TS_OK;
}

/* WAIT for keys; answers STOP_WAITING once all exist. */
static ts_status wait_keys(torch_store *t, const char *const *keys, int nkeys, double timeout_s, const char *what) {
    ts__wbuf req = {0};
    wb_keys(&req, t->gen, Q_WAIT, keys, nkeys);
    uint8_t ans = 0xff;
    ts_status st = call(t, &req, timeout_s, what, &ans, 1, NULL, NULL);
    free(req.p);
    TS_TRY(st);
    if (ans != WAIT_STOP_WAITING)
        return ts_error(TS_ERR_REMOTE, "torch store %s: answered WAIT with byte %u (expected 0) %s", t->hp, ans, what);
    return TS_OK;
}

static ts_status torch_get(ts_store *s, const char *key, double timeout_s, void **value, size_t *len) {
    torch_store *t = (torch_store *)s;
    TS_TRY(check_key(t, key));
    char what[300];
    snprintf(what, sizeof what, "waiting for key '%.200s'", key);
    double t0 = ts_time_now();
    TS_TRY(wait_keys(t, &key, 1, timeout_s, what));
    snprintf(what, sizeof what, "getting key '%.200s'", key);
    ts__wbuf req = {0};
    wb_q(&req, t->gen, Q_GET);
    wb_key(&req, key);
    uint8_t *v = NULL;
    size_t vl = 0;
    ts_status st = call(t, &req, TS_MAX(timeout_s - (ts_time_now() - t0), 0.001), what, NULL, 0, &v, &vl);
    free(req.p);
    TS_TRY(st);
    *value = v;
    *len = vl;
    return TS_OK;
}

static ts_status torch_add(ts_store *s, const char *key, int64_t delta, double timeout_s, int64_t *result) {
    torch_store *t = (torch_store *)s;
    TS_TRY(check_key(t, key));
    char what[300];
    snprintf(what, sizeof what, "adding to key '%.200s' (the server closes the connection when its value is not an "
                                "integer)", key);
    ts__wbuf req = {0};
    wb_q(&req, t->gen, Q_ADD);
    wb_key(&req, key);
    ts__wbuf_le(&req, (uint64_t)delta, 8);
    uint8_t ans[8];
    ts_status st = call(t, &req, timeout_s, what, ans, 8, NULL, NULL);
    free(req.p);
    TS_TRY(st);
    *result = (int64_t)ts__get_le(ans, 8);
    return TS_OK;
}

static ts_status torch_check(ts_store *s, const char *key, double timeout_s, bool *exists) {
    torch_store *t = (torch_store *)s;
    TS_TRY(check_key(t, key));
    char what[300];
    snprintf(what, sizeof what, "checking key '%.200s'", key);
    ts__wbuf req = {0};
    wb_keys(&req, t->gen, Q_CHECK, &key, 1);
    uint8_t ans = 0xff;
    ts_status st = call(t, &req, timeout_s, what, &ans, 1, NULL, NULL);
    free(req.p);
    TS_TRY(st);
    if (ans != CHECK_READY && ans != CHECK_NOT_READY)
        return ts_error(TS_ERR_REMOTE, "torch store %s: answered CHECK with byte %u (expected 0 or 1)", t->hp, ans);
    *exists = ans == CHECK_READY;
    return TS_OK;
}

static ts_status torch_wait(ts_store *s, const char *const *keys, int nkeys, double timeout_s) {
    torch_store *t = (torch_store *)s;
    for (int i = 0; i < nkeys; i++) TS_TRY(check_key(t, keys[i]));
    char what[300];
    snprintf(what, sizeof what, "waiting for key '%.200s'%s", keys[0], nkeys > 1 ? " and others" : "");
    ts_status st = wait_keys(t, keys, nkeys, timeout_s, what);
    if (st != TS_ERR_TIMEOUT || nkeys == 1) return st;
    const char *missing = keys[0]; /* name the first key still missing (best effort) */
    for (int i = 0; i < nkeys; i++) {
        bool ex = false;
        if (torch_check(s, keys[i], TS_MIN(1.0, ts__store_timeout(s)), &ex) != TS_OK) break;
        if (!ex) {
            missing = keys[i];
            break;
        }
    }
    return ts_error(TS_ERR_TIMEOUT, "torch store %s: timed out after %.3g s waiting for key '%.200s'", t->hp,
                    timeout_s, missing);
}

static void torch_destroy(ts_store *s) {
    torch_store *t = (torch_store *)s;
    ts__sock_pool_destroy(&t->pool);
    free(t);
}

static const ts_store_vtable torch_vtable = {"torch", torch_set, torch_get, torch_add, torch_wait, torch_check, NULL,
                                             torch_destroy};

/* sock.h's handshake hook for the first connection: a server that answers wrongly is not retried. */
static ts_status first_hello(void *ctx, int fd, double deadline, bool *retry, char *why, size_t wn) {
    torch_store *t = ctx;
    *retry = false;
    TS_UNUSED(why);
    TS_UNUSED(wn);
    return handshake(t, fd, deadline, TS_MAX(deadline - ts_time_now(), 0.0));
}

/* The first connection: resolve, connect and probe (2.x first, then 1.x on a new connection
 * when the server dropped 2.x's probe), retrying refused or unreachable addresses with
 * backoff until the deadline. */
static ts_status first_connect(torch_store *t, double timeout_s) {
    double t0 = ts_time_now();
    int fd = -1;
    t->probing = true;
    t->gen = GEN_2;
    ts_status st = ts__sock_dial("torch store", t->host, t->port, timeout_s, first_hello, t, &fd, &t->addr,
                                 &t->addrlen);
    if (st != TS_OK && t->dropped_probe) {
        t->gen = GEN_1;
        double left = TS_MAX(timeout_s - (ts_time_now() - t0), 0.001);
        st = ts__sock_dial("torch store", t->host, t->port, left, first_hello, t, &fd, &t->addr, &t->addrlen);
        if (st == TS_OK) ts_log(TS_LOG_DEBUG, "torch store %s: a TCPStore of torch 1.x", t->hp);
    }
    t->probing = false;
    if (st != TS_OK && strstr(ts_last_error(), "nothing answered")) {
        char msg[600];
        snprintf(msg, sizeof msg, "%s", ts_last_error());
        st = ts_error(st, "%s; is a PyTorch TCPStore listening there (torchrun's agent store on MASTER_PORT)?", msg);
    }
    TS_TRY(st);
    ts__sock_pool_put(&t->pool, fd);
    return TS_OK;
}

ts_status ts_store_torch_new(const char *host, int port, double timeout_s, ts_store **out) {
    TS_ARG(host && out, "ts_store_torch_new: NULL argument");
    TS_ARG(host[0] && strlen(host) < 256, "ts_store_torch_new: host must be 1 to 255 characters");
    TS_ARG(port >= 1 && port <= 65535, "ts_store_torch_new: port %d out of range 1..65535", port);
    *out = NULL;
    torch_store *t = ts__calloc(1, sizeof *t);
    if (!t) return TS_ERR_NOMEM;
    snprintf(t->host, sizeof t->host, "%s", host);
    ts__sock_hostport(t->hp, sizeof t->hp, host, port);
    t->port = port;
    ts__sock_pool_init(&t->pool);
    ts__store_init(&t->base, &torch_vtable, timeout_s);
    ts_status st = first_connect(t, ts__store_timeout(&t->base));
    if (st != TS_OK) {
        torch_destroy(&t->base);
        return st;
    }
    *out = &t->base;
    return TS_OK;
}
