/*
 * distributed/store_torch.c — a client of PyTorch's TCPStore: the store torchrun's
 * agent serves on MASTER_PORT (TORCHELASTIC_USE_AGENT_STORE=True), or any
 * torch.distributed.TCPStore. Every rank is a client; nobody here serves.
 *
 * ---- wire protocol (torch/csrc/distributed/c10d: TCPStore.cpp's client,
 * store/TCPStoreBackend.hpp's QueryType, Utils.hpp's tcputil; checked byte for
 * byte against torch 2.15's libuv server and its own client) -----------------
 * No framing: a request is a query byte and its arguments, a reply is bare
 * values, all little-endian. A string or byte vector is  u64 length | bytes.
 *     0  VALIDATE     u32 0x3C85F7CE                      no reply; must be a connection's first query
 *     1  SET          str key | bytes value               no reply
 *     3  GET          str key                             bytes value (the key must exist: the classic
 *                                                         server closes the connection, libuv answers empty)
 *     4  ADD          str key | i64 delta                 i64 new value (the value is decimal text)
 *     5  CHECK        u64 n | n x str key                 u8 0 READY (all exist) / 1 NOT_READY
 *     6  WAIT         u64 n | n x str key                 u8 0 STOP_WAITING, once all exist
 *     12 CANCEL_WAIT                                      u8 1 WAIT_CANCELED
 * The server reads a connection's queries in order and parks a WAIT without
 * blocking the queries after it, so a GET is sent only after its WAIT was
 * answered (as torch's client does). torch's client names every key "/" + key;
 * so do we, so that Python's store.get("k") sees our "k".
 *
 * ---- this client --------------------------------------------------------------------------------
 * A pool of connections (threads sharing the store never queue behind a parked
 * WAIT), each opened with VALIDATE and proved by a CHECK whose one-byte answer
 * only a TCPStore gives (a tessera TCP store or another server makes that time
 * out or close: an error naming host:port). SET is followed by a CHECK of its
 * key in the same write, so a set that returns TS_OK is stored. Every send and
 * receive is bounded by the call's deadline; a connection that timed out or
 * failed is closed, never reused (closing drops a parked WAIT on the server:
 * simpler than CANCEL_WAIT, and the same to the server). Keys up to 8 KiB and
 * values up to 8 MiB: the libuv server's limits, checked here first.
 */
#include "distributed/store.h"

#include <errno.h>
#include <inttypes.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <sys/socket.h>
#include <unistd.h>

enum { Q_VALIDATE = 0, Q_SET = 1, Q_GET = 3, Q_ADD = 4, Q_CHECK = 5, Q_WAIT = 6 };
enum { CHECK_READY = 0, CHECK_NOT_READY = 1 };
enum { WAIT_STOP_WAITING = 0 };
#define VALIDATE_MAGIC 0x3C85F7CEu
#define MAX_KEY 8192u          /* with the "/" */
#define MAX_VALUE (8u << 20)   /* what we send */
#define MAX_REPLY (1ull << 30) /* what we accept back */

/* ---- requests ------------------------------------------------------------------------------------- */

typedef struct wbuf {
    uint8_t *p;
    size_t n, cap;
    bool oom;
} wbuf;

static void wb_put(wbuf *b, const void *d, size_t n) {
    if (b->oom) return;
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->n + n) cap *= 2;
        uint8_t *p = realloc(b->p, cap);
        if (!p) {
            b->oom = true;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->n, d, n);
    b->n += n;
}

static void wb_le(wbuf *b, uint64_t v, int n) {
    uint8_t t[8];
    for (int i = 0; i < n; i++, v >>= 8) t[i] = (uint8_t)v;
    wb_put(b, t, (size_t)n);
}

static void wb_u8(wbuf *b, uint8_t v) { wb_put(b, &v, 1); }

static void wb_bytes(wbuf *b, const void *d, size_t n) {
    wb_le(b, n, 8);
    wb_put(b, d, n);
}

/* A key as torch's client sends it: "/" + key. */
static void wb_key(wbuf *b, const char *key) {
    size_t n = strlen(key);
    wb_le(b, n + 1, 8);
    wb_put(b, "/", 1);
    wb_put(b, key, n);
}

static uint64_t get_le(const uint8_t *p, int n) {
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

/* ---- socket I/O with deadlines ------------------------------------------------------------------- */

enum { IO_OK = 0, IO_TIMEOUT, IO_CLOSED, IO_ERR };

static int io_wait(int fd, short events, double deadline) {
    for (;;) {
        double left = deadline - ts_time_now();
        if (left <= 0) return IO_TIMEOUT;
        int ms = left > 86400.0 ? 86400000 : (int)(left * 1000.0) + 1;
        struct pollfd p = {fd, events, 0};
        int r = poll(&p, 1, ms);
        if (r < 0 && errno != EINTR) return IO_ERR;
        if (r > 0) return IO_OK;
    }
}

static int io_send(int fd, const uint8_t *p, size_t n, double deadline) {
    while (n) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w > 0) {
            p += w;
            n -= (size_t)w;
        } else if (w < 0 && errno == EINTR) {
            continue;
        } else if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            int r = io_wait(fd, POLLOUT, deadline);
            if (r != IO_OK) return r;
        } else {
            return (errno == EPIPE || errno == ECONNRESET) ? IO_CLOSED : IO_ERR;
        }
    }
    return IO_OK;
}

static int io_recv(int fd, uint8_t *p, size_t n, double deadline) {
    while (n) {
        ssize_t r = recv(fd, p, n, 0);
        if (r > 0) {
            p += r;
            n -= (size_t)r;
        } else if (r == 0) {
            return IO_CLOSED;
        } else if (errno == EINTR) {
            continue;
        } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
            int w = io_wait(fd, POLLIN, deadline);
            if (w != IO_OK) return w;
        } else {
            return errno == ECONNRESET ? IO_CLOSED : IO_ERR;
        }
    }
    return IO_OK;
}

/* One non-blocking connect, bounded by deadline: the fd, or -1 with *err. */
static int connect_one(const struct sockaddr *sa, socklen_t salen, double deadline, int *err) {
    int fd = socket(sa->sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        *err = errno;
        return -1;
    }
    if (connect(fd, sa, salen) != 0) {
        if (errno != EINPROGRESS) {
            *err = errno;
            close(fd);
            return -1;
        }
        int r = io_wait(fd, POLLOUT, deadline);
        int soerr = 0;
        socklen_t sl = sizeof soerr;
        if (r == IO_OK && getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) != 0) soerr = errno;
        if (r != IO_OK || soerr) {
            *err = r == IO_TIMEOUT ? ETIMEDOUT : r == IO_ERR ? errno : soerr;
            close(fd);
            return -1;
        }
    }
    int one = 1;
    (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return fd;
}

/* ---- the store ---------------------------------------------------------------------------------------- */

typedef struct torch_store {
    ts_store base;
    char host[256];
    char hp[300]; /* "host:port" for messages */
    int port;
    struct sockaddr_storage addr; /* the address that answered */
    socklen_t addrlen;
    pthread_mutex_t mu; /* guards the pool */
    int *pool;
    int npool, cap;
} torch_store;

static ts_status io_error(const torch_store *t, int r, int err, double timeout_s, const char *what) {
    if (r == IO_TIMEOUT)
        return ts_error(TS_ERR_TIMEOUT, "torch store %s: timed out after %.3g s %s", t->hp, timeout_s, what);
    if (r == IO_CLOSED)
        return ts_error(TS_ERR_REMOTE, "torch store %s: the server closed the connection %s", t->hp, what);
    return ts_error(TS_ERR_REMOTE, "torch store %s: %s %s", t->hp, strerror(err), what);
}

/* VALIDATE, then a CHECK that only a TCPStore answers with one byte 0 or 1. */
static ts_status handshake(const torch_store *t, int fd, double deadline, double timeout_s) {
    wbuf b = {0};
    wb_u8(&b, Q_VALIDATE);
    wb_le(&b, VALIDATE_MAGIC, 4);
    wb_u8(&b, Q_CHECK);
    wb_le(&b, 1, 8);
    wb_key(&b, "tessera/hello");
    if (b.oom) {
        free(b.p);
        return ts_error(TS_ERR_NOMEM, "torch store: out of memory");
    }
    uint8_t ans = 0xff;
    int r = io_send(fd, b.p, b.n, deadline);
    int err = errno;
    free(b.p);
    if (r == IO_OK) r = io_recv(fd, &ans, 1, deadline), err = errno;
    if (r == IO_TIMEOUT)
        return ts_error(TS_ERR_TIMEOUT,
                        "torch store %s: no answer within %.3g s to VALIDATE and CHECK: is a PyTorch TCPStore "
                        "listening there (torchrun's agent store on MASTER_PORT)?",
                        t->hp, timeout_s);
    if (r == IO_CLOSED)
        return ts_error(TS_ERR_REMOTE,
                        "torch store %s: the server closed the connection after VALIDATE: not a PyTorch TCPStore "
                        "of torch >= 2.0 (or it refused this client)",
                        t->hp);
    if (r != IO_OK) return io_error(t, r, err, timeout_s, "validating the connection");
    if (ans != CHECK_READY && ans != CHECK_NOT_READY)
        return ts_error(TS_ERR_REMOTE, "torch store %s: answered CHECK with byte %u (expected 0 or 1): not a PyTorch "
                        "TCPStore", t->hp, ans);
    return TS_OK;
}

static void pool_put(torch_store *t, int fd) {
    pthread_mutex_lock(&t->mu);
    if (t->npool == t->cap) {
        int cap = t->cap ? t->cap * 2 : 8;
        int *p = realloc(t->pool, sizeof *p * (size_t)cap);
        if (!p) {
            pthread_mutex_unlock(&t->mu);
            close(fd);
            return;
        }
        t->pool = p;
        t->cap = cap;
    }
    t->pool[t->npool++] = fd;
    pthread_mutex_unlock(&t->mu);
}

static ts_status pool_take(torch_store *t, double deadline, double timeout_s, int *fd) {
    pthread_mutex_lock(&t->mu);
    *fd = t->npool ? t->pool[--t->npool] : -1;
    pthread_mutex_unlock(&t->mu);
    if (*fd >= 0) return TS_OK;
    int err = 0;
    *fd = connect_one((const struct sockaddr *)&t->addr, t->addrlen, deadline, &err);
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
static ts_status call(torch_store *t, wbuf *req, double timeout_s, const char *what, uint8_t *reply, size_t n,
                      uint8_t **var, size_t *varlen) {
    if (req->oom) return ts_error(TS_ERR_NOMEM, "torch store: out of memory building a request");
    double deadline = ts_time_now() + timeout_s;
    int fd;
    TS_TRY(pool_take(t, deadline, timeout_s, &fd));
    int r = io_send(fd, req->p, req->n, deadline), err = errno;
    if (r == IO_OK && n) r = io_recv(fd, reply, n, deadline), err = errno;
    uint8_t *v = NULL;
    if (r == IO_OK && var) {
        uint8_t lb[8];
        r = io_recv(fd, lb, 8, deadline), err = errno;
        uint64_t len = r == IO_OK ? get_le(lb, 8) : 0;
        if (r == IO_OK && len > MAX_REPLY) {
            close(fd);
            return ts_error(TS_ERR_REMOTE, "torch store %s: a reply of %" PRIu64 " bytes %s: not a TCPStore reply",
                            t->hp, len, what);
        }
        if (r == IO_OK) {
            v = ts__malloc((size_t)len + 1);
            if (!v) {
                close(fd);
                return TS_ERR_NOMEM;
            }
            r = io_recv(fd, v, (size_t)len, deadline), err = errno;
            v[len] = 0;
            *varlen = (size_t)len;
        }
    }
    if (r != IO_OK) {
        close(fd);
        free(v);
        return io_error(t, r, err, timeout_s, what);
    }
    pool_put(t, fd);
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
    wbuf req = {0};
    wb_u8(&req, Q_SET);
    wb_key(&req, key);
    wb_bytes(&req, value, len);
    wb_u8(&req, Q_CHECK); /* the set's confirmation */
    wb_le(&req, 1, 8);
    wb_key(&req, key);
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
    wbuf req = {0};
    wb_u8(&req, Q_WAIT);
    wb_le(&req, (uint64_t)nkeys, 8);
    for (int i = 0; i < nkeys; i++) wb_key(&req, keys[i]);
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
    wbuf req = {0};
    wb_u8(&req, Q_GET);
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
    wbuf req = {0};
    wb_u8(&req, Q_ADD);
    wb_key(&req, key);
    wb_le(&req, (uint64_t)delta, 8);
    uint8_t ans[8];
    ts_status st = call(t, &req, timeout_s, what, ans, 8, NULL, NULL);
    free(req.p);
    TS_TRY(st);
    *result = (int64_t)get_le(ans, 8);
    return TS_OK;
}

static ts_status torch_check(ts_store *s, const char *key, double timeout_s, bool *exists) {
    torch_store *t = (torch_store *)s;
    TS_TRY(check_key(t, key));
    char what[300];
    snprintf(what, sizeof what, "checking key '%.200s'", key);
    wbuf req = {0};
    wb_u8(&req, Q_CHECK);
    wb_le(&req, 1, 8);
    wb_key(&req, key);
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
    for (int i = 0; i < t->npool; i++) close(t->pool[i]);
    free(t->pool);
    pthread_mutex_destroy(&t->mu);
    free(t);
}

static const ts_store_vtable torch_vtable = {"torch", torch_set, torch_get, torch_add, torch_wait, torch_check, NULL,
                                             torch_destroy};

/* The first connection: resolve, connect and validate, retrying refused or
 * unreachable addresses with backoff until the deadline. A server that answers
 * wrongly is not retried. */
static ts_status first_connect(torch_store *t, double timeout_s) {
    double deadline = ts_time_now() + timeout_s, backoff = 0.01;
    char ps[16], last[160] = "no attempt made";
    snprintf(ps, sizeof ps, "%d", t->port);
    for (;;) {
        struct addrinfo hints, *res = NULL;
        memset(&hints, 0, sizeof hints);
        hints.ai_family = AF_UNSPEC;
        hints.ai_socktype = SOCK_STREAM;
        hints.ai_flags = AI_NUMERICSERV;
        int g = getaddrinfo(t->host, ps, &hints, &res);
        if (g != 0) {
            snprintf(last, sizeof last, "cannot resolve '%.100s': %s", t->host, gai_strerror(g));
        } else {
            for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
                int err = 0;
                int fd = connect_one(ai->ai_addr, ai->ai_addrlen, deadline, &err);
                if (fd < 0) {
                    snprintf(last, sizeof last, "%s", strerror(err));
                    continue;
                }
                ts_status st = handshake(t, fd, deadline, timeout_s);
                if (st != TS_OK) {
                    close(fd);
                    freeaddrinfo(res);
                    return st;
                }
                memcpy(&t->addr, ai->ai_addr, ai->ai_addrlen);
                t->addrlen = ai->ai_addrlen;
                freeaddrinfo(res);
                pool_put(t, fd);
                return TS_OK;
            }
            freeaddrinfo(res);
        }
        double left = deadline - ts_time_now();
        if (left <= 0) break;
        ts__sleep_s(TS_MIN(backoff, left));
        backoff = TS_MIN(backoff * 2, 1.0);
    }
    return ts_error(TS_ERR_TIMEOUT,
                    "torch store: cannot connect to the PyTorch TCPStore at %s: nothing answered within %.3g s (last "
                    "error: %s)",
                    t->hp, timeout_s, last);
}

ts_status ts_store_torch_new(const char *host, int port, double timeout_s, ts_store **out) {
    TS_ARG(host && out, "ts_store_torch_new: NULL argument");
    TS_ARG(host[0] && strlen(host) < 256, "ts_store_torch_new: host must be 1 to 255 characters");
    TS_ARG(port >= 1 && port <= 65535, "ts_store_torch_new: port %d out of range 1..65535", port);
    *out = NULL;
    torch_store *t = ts__calloc(1, sizeof *t);
    if (!t) return TS_ERR_NOMEM;
    snprintf(t->host, sizeof t->host, "%s", host);
    snprintf(t->hp, sizeof t->hp, strchr(host, ':') ? "[%s]:%d" : "%s:%d", host, port);
    t->port = port;
    pthread_mutex_init(&t->mu, NULL);
    ts__store_init(&t->base, &torch_vtable, timeout_s);
    ts_status st = first_connect(t, ts__store_timeout(&t->base));
    if (st != TS_OK) {
        torch_destroy(&t->base);
        return st;
    }
    *out = &t->base;
    return TS_OK;
}
