/*
 * distributed/store_tcp.c — the TCP store (torch's TCPStore): rank 0 runs a server
 * thread that holds the keys; every rank, rank 0 included, is a client.
 *
 * ---- wire protocol ------------------------------------------------------------------------------
 * Every connection opens with the job-token handshake of distributed/auth.h
 * (kind 1, store): the server sends a challenge carrying its key and value
 * limits, the client answers with its HMAC (and its rank + 1 and the world
 * size, or 0, 0), the server's verdict carries its own. Only then, and only once the client has checked the server's proof,
 * does the protocol below start; a client refused, or a server that fails its
 * proof, gets TS_ERR_REMOTE naming host:port and the reason.
 *
 * All integers are big-endian. A string is  u32 length | bytes  (keys contain no NUL).
 * Every message, in both directions, is one frame:
 *     u32 body_length | body          (body_length >= 1, at most 1 GiB)
 * Request bodies start with an opcode byte:
 *     1 SET    str key | str value            reply: OK
 *     2 GET    str key                        reply: OK | str value        (parked until key exists)
 *     3 ADD    str key | i64 delta            reply: OK | i64 new value, or ERROR | str message
 *     4 CHECK  str key                        reply: OK | u8 exists (0/1)
 *     5 WAIT   u32 n | n x str key            reply: OK                    (parked until all exist)
 * Reply bodies start with a status byte: 0 OK, 1 ERROR (followed by a message).
 * A connection carries one request at a time: the client sends a request and
 * reads its reply before sending the next. The server never times a request
 * out; a client that gives up on a parked GET/WAIT closes its connection and
 * the server forgets the request. Add stores the counter as decimal text, so
 * GET on a counter reads e.g. "12". An unknown opcode, a malformed or oversize
 * frame closes the connection.
 *
 * ---- server ---------------------------------------------------------------------------------------
 * One thread, poll() over a self-pipe (written by release to stop it), the
 * listening socket and every connection (non-blocking, TCP_NODELAY). Parked
 * requests are re-examined after every SET/ADD. On stop it closes every
 * connection, so clients blocked in a GET see the connection close and return
 * TS_ERR_REMOTE. The listening socket uses SO_REUSEADDR and binds the address
 * the given host resolves to (127.0.0.1 stays local). Signals are blocked in
 * the thread.
 *
 * Limits (ts_store_tcp_options), so that no client can exhaust the server:
 *  - a connection must finish the handshake within auth_timeout_s (3 s) and
 *    may send no more than the 80-byte answer before its verdict; strangers,
 *    wrong tokens and silent connections are closed and logged (ts_log WARN
 *    with their address, at most 20 lines per 10 s, the rest counted);
 *  - at most max_connections connections: when full, a new one evicts the
 *    oldest unauthenticated one (a genuine client authenticates in one round
 *    trip, so a flood of idle connections cannot lock ranks out), else the
 *    authenticated one idle longest that is surplus — not a rank's (a client
 *    says which rank it is in its handshake answer: f1 = rank + 1, f2 = world,
 *    checked against the server's world_size) or past RANK_QUOTA of one rank's
 *    — so insiders holding idle connections cannot lock ranks out either; it is
 *    closed at once only when every slot is a rank's (its client retries);
 *  - stored bytes (key + value + 16 per entry): a SET, or an ADD that creates a
 *    counter, that would take the store past max_total_bytes or its connection
 *    past max_conn_bytes (bytes it added) gets an ERROR reply naming the limit;
 *    the connection stays and the server keeps serving; A pending
 *    connection is only evicted once it has had 100 ms to answer; until then
 *    newcomers wait in the kernel's backlog (the listener leaves poll());
 *  - accept() failing with EMFILE/ENFILE (or ENOBUFS/ENOMEM) while someone
 *    waits also evicts the oldest unauthenticated connection, else takes the
 *    listener out of poll() for 100 ms: a readable listener never turns into a
 *    busy loop;
 *  - per connection: a frame over max_key + max_value + 64 bytes (announced
 *    in its header), a key over max_key_bytes or a value over max_value_bytes
 *    drops the client with a logged reason, and the input buffer never holds
 *    more than one such frame (bytes sent beyond it, e.g. behind a parked GET,
 *    drop the client). Requests are not executed while more than 256 KiB of
 *    replies wait to be sent. So a connection costs at most about one frame
 *    in and one reply out, and large buffers are freed once used;
 *  - authenticated connections have TCP keepalive (a peer that vanished is
 *    dropped after about two minutes); idle ones are otherwise kept, since
 *    clients pool idle connections between calls.
 *
 * ---- client ---------------------------------------------------------------------------------------
 * The first connection is retried (getaddrinfo, IPv4 and IPv6, then a non-
 * blocking connect) with backoff from 10 ms doubling to 1 s until the timeout;
 * an authentication failure is final. The store keeps a pool of idle
 * connections: each call takes one (or opens and authenticates a new one to
 * the address that worked, retrying while the server closes it during the
 * handshake because it is full), so threads sharing a store never wait behind
 * each other's parked GET. Every send/recv goes through poll() with the time
 * left before the call's deadline (distributed/sock.c, the client side's socket
 * I/O, dial and pool, shared with store_torch.c); a connection that timed out
 * or failed is closed, never reused. Keys and values over the limits the server announced
 * are refused locally with TS_ERR_INVALID_ARG.
 */
#include "core/env.h"
#include "distributed/sock.h"
#include "distributed/store.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <strings.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

enum { OP_SET = 1, OP_GET = 2, OP_ADD = 3, OP_CHECK = 4, OP_WAIT = 5 };
enum { ST_OK = 0, ST_ERROR = 1 };
#define MAX_FRAME (1u << 30)
#define FRAME_OVERHEAD 64u                   /* a frame's bytes besides one key and one value */
#define DEFAULT_MAX_KEY ((size_t)64 << 10)
#define DEFAULT_MAX_VALUE ((size_t)64 << 20)
#define DEFAULT_MAX_CONNS 16384
#define OUT_HIGH ((size_t)256 << 10)         /* pending reply bytes above which requests wait */
#define SHRINK_ABOVE ((size_t)1 << 20)       /* idle buffers larger than this are freed */
#define ACCEPT_BATCH 64                      /* accepts per poll round */
#define ACCEPT_PAUSE_S 0.1                   /* listener off poll() after EMFILE with nothing to evict */
#define EVICT_MIN_AGE_S 0.1                  /* a pending connection has this long to answer before eviction */
#define CLIENT_HANDSHAKE_S 30.0              /* a client waits this long for the server's challenge */
#define DEFAULT_AUTH_TIMEOUT_S 3.0           /* a store client authenticates in one round trip */
#define DEFAULT_TOTAL_BASE ((size_t)512 << 20) /* max_total_bytes: this much ... */
#define DEFAULT_TOTAL_PER_RANK ((size_t)1 << 20) /* ... plus this much per rank of the world */
#define RANK_QUOTA 8                         /* connections per rank that are never evicted for newcomers */
#define ENTRY_OVERHEAD 16u                   /* bytes a stored key costs besides its key and value */
#define TS__STORE_BIND_RETRY_S 5.0           /* a port in use is tried again this long (a restart's old server) */

/* ---- byte helpers (framing over sock.h's buffer) ----------------------------------------------------- */


/* Frees an empty buffer's memory when it grew large (a big value passed through). */
static void wb_shrink(ts__wbuf *b) {
    if (b->n == 0 && b->cap > SHRINK_ABOVE) {
        free(b->p);
        b->p = NULL;
        b->cap = 0;
    }
}

static void wb_str(ts__wbuf *b, const void *d, size_t n) {
    ts__wbuf_be(b, n, 4);
    ts__wbuf_put(b, d, n);
}

/* Starts a frame: a length placeholder and the first body byte. */
static void wb_frame(ts__wbuf *b, uint8_t first) {
    b->n = 0;
    ts__wbuf_be(b, 0, 4);
    ts__wbuf_put(b, &first, 1);
}

/* Fills in the length of the frame that starts at offset start. */
static void wb_frame_end(ts__wbuf *b, size_t start) {
    if (!b->oom) ts__put_be(b->p + start, b->n - start - 4, 4);
}

/* Reads fields from a frame body; bad is sticky. */
typedef struct rbuf {
    const uint8_t *p;
    size_t n, off;
    bool bad;
} rbuf;

static uint64_t rb_int(rbuf *r, int n) {
    if (r->bad || r->n - r->off < (size_t)n) {
        r->bad = true;
        return 0;
    }
    uint64_t v = ts__get_be(r->p + r->off, n);
    r->off += (size_t)n;
    return v;
}

static const uint8_t *rb_str(rbuf *r, size_t *len) {
    size_t n = (size_t)rb_int(r, 4);
    if (r->bad || r->n - r->off < n) {
        r->bad = true;
        return NULL;
    }
    const uint8_t *p = r->p + r->off;
    r->off += n;
    *len = n;
    return p;
}

/* ---- the server --------------------------------------------------------------------------------------- */

typedef struct srv_conn {
    int fd; /* -1 once dropped */
    bool authed, dead;
    double since;                 /* accepted at */
    double deadline;              /* unauthenticated: refused after this */
    struct srv_conn *prev, *next; /* the unauthenticated list, oldest first */
    char addr[64];                /* the peer, for logs */
    uint8_t ch[TS__AUTH_CHALLENGE_BYTES], hs[TS__AUTH_RESPONSE_BYTES];
    size_t hs_n; /* bytes of the answer received */
    ts__wbuf in, out;
    size_t out_off;
    uint8_t parked; /* 0, OP_GET or OP_WAIT */
    char **keys;    /* the parked request's keys */
    int nkeys;
    int rank;       /* the rank it identified as (authenticated), -1: none */
    bool surplus;   /* not a rank's, or beyond RANK_QUOTA of its rank's: evicted first when full */
    size_t added;   /* stored bytes this connection added (max_conn_bytes) */
    double active;  /* its last request */
} srv_conn;

typedef struct tcp_server {
    int lfd;
    int wake[2];
    pthread_t thread;
    ts__kv kv;
    srv_conn **conns;
    int nconns, cap; /* entries in conns (dropped ones until the end of the round) */
    int nlive;       /* connections not dropped */
    srv_conn *unauth_head, *unauth_tail;
    bool changed; /* a SET/ADD happened: re-examine parked requests */
    ts__auth auth;
    char hp[300]; /* "host:port", for logs */
    int max_conns;
    size_t max_key, max_value, max_frame;
    double auth_timeout;
    double accept_resume; /* the listener is left out of poll() until then */
    bool accept_failing;  /* logged once per episode */
    ts__refusal_log rlog;
    size_t max_total, max_conn_bytes, stored; /* stored: key + value + ENTRY_OVERHEAD of every entry */
    int world;      /* ranks expected (0: unknown) */
    int *per_rank;  /* authenticated connections per rank (world entries) */
} tcp_server;

static void unauth_unlink(tcp_server *S, srv_conn *c) {
    if (c->prev) c->prev->next = c->next;
    else S->unauth_head = c->next;
    if (c->next) c->next->prev = c->prev;
    else S->unauth_tail = c->prev;
    c->prev = c->next = NULL;
}

static void conn_unpark(srv_conn *c) {
    for (int i = 0; i < c->nkeys; i++) free(c->keys[i]);
    free(c->keys);
    c->keys = NULL;
    c->nkeys = 0;
    c->parked = 0;
}

/* Drops a connection now (its fd is closed at once, so an fd is free for accept);
 * the struct goes at the end of the round. */
static void conn_kill(tcp_server *S, srv_conn *c) {
    if (c->dead) return;
    c->dead = true;
    if (!c->authed) unauth_unlink(S, c);
    else if (c->rank >= 0 && S->per_rank) S->per_rank[c->rank]--;
    close(c->fd);
    c->fd = -1;
    S->nlive--;
}

/* Drops a connection and logs why (rate-limited). */
static void conn_drop(tcp_server *S, srv_conn *c, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void conn_drop(tcp_server *S, srv_conn *c, const char *fmt, ...) {
    if (c->dead) return;
    char why[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    ts__refusal(&S->rlog, "tcp store %s: %s %s: %s", S->hp, c->authed ? "dropped the client" : "refused a connection from",
                c->addr, why);
    conn_kill(S, c);
}

static void conn_free(srv_conn *c) {
    if (c->fd >= 0) close(c->fd);
    conn_unpark(c);
    free(c->in.p);
    free(c->out.p);
    free(c);
}

/* Reads a key from r: a NUL-terminated copy; NULL if malformed, holding a NUL, over the limit
 * (*too_long set), or out of memory. */
static char *rb_key(tcp_server *S, rbuf *r, size_t *too_long) {
    size_t n = 0;
    const uint8_t *p = rb_str(r, &n);
    if (!p || memchr(p, 0, n)) return NULL;
    if (n > S->max_key) {
        *too_long = n;
        return NULL;
    }
    char *k = malloc(n + 1);
    if (!k) return NULL;
    memcpy(k, p, n);
    k[n] = 0;
    return k;
}

static void reply_status(srv_conn *c, uint8_t st) {
    size_t start = c->out.n;
    ts__wbuf_be(&c->out, 0, 4);
    ts__wbuf_put(&c->out, &st, 1);
    wb_frame_end(&c->out, start);
}

static void reply_error(srv_conn *c, const char *msg) {
    size_t start = c->out.n;
    uint8_t err = ST_ERROR;
    ts__wbuf_be(&c->out, 0, 4);
    ts__wbuf_put(&c->out, &err, 1);
    wb_str(&c->out, msg, strlen(msg));
    wb_frame_end(&c->out, start);
}

/* The bytes an entry costs the store. */
static size_t entry_bytes(const char *key, size_t vlen) { return strlen(key) + vlen + ENTRY_OVERHEAD; }

/* Whether a change that grows the store by `grow` bytes fits both limits; else the error reply
 * (the request is refused, the connection stays) and false. */
static bool room_for(tcp_server *S, srv_conn *c, const char *what, const char *key, size_t grow) {
    char msg[512];
    if (S->stored + grow > S->max_total)
        snprintf(msg, sizeof msg,
                 "%s key '%.100s' would take the store past its limit of %zu bytes in total "
                 "(ts_store_tcp_options.max_total_bytes; it holds %zu)", what, key, S->max_total, S->stored);
    else if (c->added + grow > S->max_conn_bytes)
        snprintf(msg, sizeof msg,
                 "%s key '%.100s' would take this connection past its limit of %zu stored bytes "
                 "(ts_store_tcp_options.max_conn_bytes; it added %zu)", what, key, S->max_conn_bytes, c->added);
    else
        return true;
    ts__refusal(&S->rlog, "tcp store %s: refused a request from %s: %s", S->hp, c->addr, msg);
    reply_error(c, msg);
    return false;
}

/* Accounts an entry that went from old_bytes (0: new) to what it holds now. */
static void account(tcp_server *S, srv_conn *c, const char *key, size_t old_bytes) {
    const ts__kv_entry *e = ts__kv_find(&S->kv, key);
    size_t now = e ? entry_bytes(key, e->len) : 0;
    S->stored = S->stored - old_bytes + now;
    if (now > old_bytes) c->added += now - old_bytes;
}

/* Answers a parked request if its keys exist now. Returns true if it did. */
static bool conn_try_answer(tcp_server *S, srv_conn *c) {
    for (int i = 0; i < c->nkeys; i++)
        if (!ts__kv_find(&S->kv, c->keys[i])) return false;
    size_t start = c->out.n;
    uint8_t ok = ST_OK;
    ts__wbuf_be(&c->out, 0, 4);
    ts__wbuf_put(&c->out, &ok, 1);
    if (c->parked == OP_GET) {
        ts__kv_entry *e = ts__kv_find(&S->kv, c->keys[0]);
        wb_str(&c->out, e->value, e->len);
    }
    wb_frame_end(&c->out, start);
    conn_unpark(c);
    return true;
}

/* Executes one request body. Returns NULL, or why the connection must close (why[] or a static string). */
static const char *conn_request(tcp_server *S, srv_conn *c, const uint8_t *body, size_t n, char *why, size_t wn) {
    rbuf r = {body, n, 0, false};
    uint8_t op = (uint8_t)rb_int(&r, 1);
    size_t vl = 0, too_long = 0;
    c->active = ts_time_now();
#define KEY_FAIL()                                                                                               \
    (too_long ? (snprintf(why, wn, "a key of %zu bytes is over the limit of %zu", too_long, S->max_key), why)    \
              : "a malformed request")
    switch (op) {
    case OP_SET: {
        char *key = rb_key(S, &r, &too_long);
        const uint8_t *v = key ? rb_str(&r, &vl) : NULL;
        if (key && v && vl > S->max_value) {
            free(key);
            snprintf(why, wn, "a value of %zu bytes is over the limit of %zu", vl, S->max_value);
            return why;
        }
        if (!key || r.bad) {
            free(key);
            return KEY_FAIL();
        }
        const ts__kv_entry *old = ts__kv_find(&S->kv, key);
        size_t ob = old ? entry_bytes(key, old->len) : 0, nb = entry_bytes(key, vl);
        if (nb > ob && !room_for(S, c, "setting", key, nb - ob)) {
            free(key);
            return NULL;
        }
        bool ok = ts__kv_set(&S->kv, key, v, vl) == TS_OK;
        if (ok) account(S, c, key, ob);
        free(key);
        if (!ok) return "out of memory";
        S->changed = true;
        reply_status(c, ST_OK);
        return NULL;
    }
    case OP_ADD: {
        char *key = rb_key(S, &r, &too_long);
        int64_t delta = (int64_t)rb_int(&r, 8), result = 0;
        if (!key || r.bad) {
            free(key);
            return KEY_FAIL();
        }
        const ts__kv_entry *old = ts__kv_find(&S->kv, key);
        size_t ob = old ? entry_bytes(key, old->len) : 0;
        if (!old && !room_for(S, c, "adding to", key, entry_bytes(key, 20))) { /* a counter: <= 20 digits */
            free(key);
            return NULL;
        }
        ts_status st = ts__kv_add(&S->kv, key, delta, &result);
        if (st == TS_OK) account(S, c, key, ob);
        free(key);
        size_t start = c->out.n;
        if (st == TS_OK) {
            S->changed = true;
            uint8_t ok = ST_OK;
            ts__wbuf_be(&c->out, 0, 4);
            ts__wbuf_put(&c->out, &ok, 1);
            ts__wbuf_be(&c->out, (uint64_t)result, 8);
        } else {
            uint8_t err = ST_ERROR;
            const char *msg = ts_last_error();
            ts__wbuf_be(&c->out, 0, 4);
            ts__wbuf_put(&c->out, &err, 1);
            wb_str(&c->out, msg, strlen(msg));
        }
        wb_frame_end(&c->out, start);
        return NULL;
    }
    case OP_CHECK: {
        char *key = rb_key(S, &r, &too_long);
        if (!key || r.bad) {
            free(key);
            return KEY_FAIL();
        }
        uint8_t ex = ts__kv_find(&S->kv, key) != NULL, ok = ST_OK;
        free(key);
        size_t start = c->out.n;
        ts__wbuf_be(&c->out, 0, 4);
        ts__wbuf_put(&c->out, &ok, 1);
        ts__wbuf_put(&c->out, &ex, 1);
        wb_frame_end(&c->out, start);
        return NULL;
    }
    case OP_GET:
    case OP_WAIT: {
        uint64_t nk = op == OP_GET ? 1 : rb_int(&r, 4);
        if (r.bad || nk == 0 || nk > n) return "a malformed request"; /* each key takes >= 4 bytes */
        c->keys = calloc((size_t)nk, sizeof *c->keys);
        if (!c->keys) return "out of memory";
        c->parked = op;
        for (uint64_t i = 0; i < nk; i++) {
            c->keys[i] = rb_key(S, &r, &too_long);
            if (!c->keys[i]) return KEY_FAIL(); /* conn_free releases the partial list */
            c->nkeys++;
        }
        conn_try_answer(S, c);
        return NULL;
    }
    default:
        snprintf(why, wn, "unknown opcode %u", (unsigned)op);
        return why;
    }
#undef KEY_FAIL
}

/* Bytes the input buffer may hold: one whole frame of the largest size. */
static size_t in_limit(const tcp_server *S) { return 4 + S->max_frame; }

/* Executes complete buffered frames while no request is parked and replies drain. */
static void conn_serve(tcp_server *S, srv_conn *c) {
    size_t pos = 0;
    char why[160];
    while (!c->dead && !c->parked && c->out.n - c->out_off < OUT_HIGH && c->in.n - pos >= 4) {
        uint64_t len = ts__get_be(c->in.p + pos, 4);
        if (len == 0 || len > S->max_frame) {
            conn_drop(S, c, "a request of %llu bytes (the limit is %zu: max_key_bytes %zu + max_value_bytes %zu + %u)",
                      (unsigned long long)len, S->max_frame, S->max_key, S->max_value, FRAME_OVERHEAD);
            break;
        }
        if (c->in.n - pos - 4 < len) {
            /* Room for exactly this frame, so a large value is received without doubling. */
            if (pos == 0 && !ts__wbuf_reserve(&c->in, 4 + (size_t)len)) conn_drop(S, c, "out of memory");
            break;
        }
        const char *bad = conn_request(S, c, c->in.p + pos + 4, (size_t)len, why, sizeof why);
        if (bad) conn_drop(S, c, "%s", bad);
        pos += 4 + (size_t)len;
    }
    if (pos && !c->dead) {
        memmove(c->in.p, c->in.p + pos, c->in.n - pos);
        c->in.n -= pos;
        wb_shrink(&c->in);
    }
    if (c->out.oom || c->in.oom) conn_drop(S, c, "out of memory");
}

static void conn_read(tcp_server *S, srv_conn *c) {
    uint8_t buf[65536];
    size_t limit = in_limit(S);
    for (;;) {
        /* Never buffer more than one frame: read at most one byte past the limit. */
        size_t want = TS_MIN(sizeof buf, limit + 1 - c->in.n);
        ssize_t r = recv(c->fd, buf, want, 0);
        if (r > 0) {
            size_t need = c->in.n + (size_t)r;
            if (need > limit) {
                conn_drop(S, c, "it sent more than one request's worth of bytes (%zu buffered, limit %zu)", need,
                          limit);
                return;
            }
            /* Grow by doubling, but never past the limit. */
            if (need > c->in.cap && !ts__wbuf_reserve(&c->in, TS_MIN(TS_MAX(need, c->in.cap * 2), limit))) {
                conn_drop(S, c, "out of memory");
                return;
            }
            ts__wbuf_put(&c->in, buf, (size_t)r);
            if (c->in.oom) break;
            if (c->in.n >= 4) { /* check the frame header as soon as it is here */
                uint64_t len = ts__get_be(c->in.p, 4);
                if (len == 0 || len > S->max_frame) break;
            }
            continue;
        }
        if (r < 0 && errno == EINTR) continue;
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
        conn_kill(S, c); /* EOF or error: the client went away */
        return;
    }
    conn_serve(S, c);
}

static void conn_flush(tcp_server *S, srv_conn *c) {
    while (!c->dead && c->out_off < c->out.n) {
        ssize_t w = send(c->fd, c->out.p + c->out_off, c->out.n - c->out_off, MSG_NOSIGNAL);
        if (w > 0) {
            c->out_off += (size_t)w;
        } else if (w < 0 && errno == EINTR) {
            continue;
        } else if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            return;
        } else {
            conn_kill(S, c);
        }
    }
    if (c->out_off == c->out.n) {
        c->out_off = c->out.n = 0;
        wb_shrink(&c->out);
    }
}

/* The handshake's answer arrives: check it, send the verdict. */
static void conn_read_auth(tcp_server *S, srv_conn *c) {
    uint8_t buf[TS__AUTH_RESPONSE_BYTES + 1];
    ssize_t r = recv(c->fd, buf, sizeof c->hs - c->hs_n + 1, 0); /* one byte more: nothing may follow */
    if (r < 0) {
        if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) return;
        conn_drop(S, c, "%s during the handshake", strerror(errno));
        return;
    }
    if (r == 0) {
        conn_drop(S, c, "it closed the connection during the handshake");
        return;
    }
    if (c->hs_n + (size_t)r > sizeof c->hs) {
        conn_drop(S, c, "it sent more than a handshake answer (not a Tessera client of this version?)");
        return;
    }
    memcpy(c->hs + c->hs_n, buf, (size_t)r);
    c->hs_n += (size_t)r;
    if (c->hs_n < sizeof c->hs) return;
    uint32_t f1 = 0, f2 = 0;
    bool local = S->auth.has_token || ts__peer_is_local(c->fd); /* only asked without a token */
    int code = ts__auth_check(&S->auth, TS__AUTH_STORE, c->ch, c->hs, local, &f1, &f2);
    uint8_t v[TS__AUTH_VERDICT_BYTES];
    code = ts__auth_verdict(&S->auth, code, c->ch, c->hs, v);
    ssize_t w = send(c->fd, v, sizeof v, MSG_NOSIGNAL | MSG_DONTWAIT); /* fits: nothing else was sent since */
    if (code != TS__AUTH_OK) {
        conn_drop(S, c, "%s", ts__auth_server_reason(code));
        return;
    }
    if (w != (ssize_t)sizeof v) {
        conn_drop(S, c, "cannot send the verdict: %s", w < 0 ? strerror(errno) : "short write");
        return;
    }
    unauth_unlink(S, c);
    c->authed = true;
    c->active = ts_time_now();
    /* who it is: a rank of the job (f1 = rank + 1), within its quota, or surplus */
    c->rank = f1 >= 1 && S->world > 0 && f1 - 1 < (uint32_t)S->world ? (int)(f1 - 1) : -1;
    c->surplus = c->rank < 0 || S->per_rank[c->rank]++ >= RANK_QUOTA;
    int one = 1, idle = 60, intvl = 10, cnt = 6; /* a vanished peer is dropped after about two minutes */
    (void)setsockopt(c->fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
    (void)setsockopt(c->fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
    (void)setsockopt(c->fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof intvl);
    (void)setsockopt(c->fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof cnt);
}

/* Closes unauthenticated connections past their deadline (the list is in deadline order). */
static void reap_unauthed(tcp_server *S, double now) {
    while (S->unauth_head && S->unauth_head->deadline <= now)
        conn_drop(S, S->unauth_head, "no handshake within %g s", S->auth_timeout);
}

enum { EVICTED, NONE_PENDING, TOO_YOUNG };

/* Makes room among authenticated connections: the surplus one (not a rank's, or past its rank's
 * quota) idle longest goes. false when there is none: every slot belongs to a rank. */
static bool evict_surplus(tcp_server *S) {
    srv_conn *victim = NULL;
    for (int i = 0; i < S->nconns; i++) {
        srv_conn *c = S->conns[i];
        if (!c->dead && c->authed && c->surplus && (!victim || c->active < victim->active)) victim = c;
    }
    if (!victim) return false;
    conn_drop(S, victim, "all %d connections are in use: the longest idle one that is not a rank's makes room",
              S->max_conns);
    return true;
}

/* Makes room by dropping the oldest unauthenticated connection, once it has had
 * EVICT_MIN_AGE_S to answer (so a genuine client is never evicted by the flood
 * that arrives right behind it). TOO_YOUNG: *ready gets when it may go. */
static int evict_oldest(tcp_server *S, const char *why, double *ready) {
    srv_conn *c = S->unauth_head;
    if (!c) return NONE_PENDING;
    if (ts_time_now() - c->since < EVICT_MIN_AGE_S) {
        *ready = c->since + EVICT_MIN_AGE_S;
        return TOO_YOUNG;
    }
    conn_drop(S, c, "%s: the oldest unauthenticated connection makes room", why);
    return EVICTED;
}

/* Stops polling the listener until `until` (it stays readable, so polling it would spin). */
static void pause_listener(tcp_server *S, double until, const char *why) {
    S->accept_resume = until;
    if (!S->accept_failing)
        ts_log(TS_LOG_WARN, "tcp store %s: %s with %d connections open; not accepting for %.0f ms", S->hp, why,
               S->nlive, (until - ts_time_now()) * 1000);
    S->accept_failing = true;
}

static void srv_accept(tcp_server *S) {
    for (int k = 0; k < ACCEPT_BATCH; k++) {
        double ready = 0;
        if (S->nlive >= S->max_conns) {
            int ev = evict_oldest(S, "connection limit reached", &ready);
            if (ev == TOO_YOUNG) {
                pause_listener(S, ready, "all connections are in use");
                return;
            }
            if (ev == NONE_PENDING && evict_surplus(S)) continue;
            if (ev == NONE_PENDING) { /* every slot is a rank's: turn the newcomer away (it retries) */
                int fd = accept4(S->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
                if (fd < 0) return;
                char addr[64];
                ts__peer_str(fd, addr, sizeof addr);
                ts__refusal(&S->rlog, "tcp store %s: refused a connection from %s: all %d connections are in use",
                            S->hp, addr, S->max_conns);
                close(fd);
                continue;
            }
        }
        struct sockaddr_storage ss;
        socklen_t sl = sizeof ss;
        int fd = accept4(S->lfd, (struct sockaddr *)&ss, &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            int e = errno;
            if (e == EINTR || e == ECONNABORTED) continue;
            if (e == EAGAIN || e == EWOULDBLOCK) return;
            char why[96];
            snprintf(why, sizeof why, "accept: %s", strerror(e));
            if (e == EMFILE || e == ENFILE || e == ENOBUFS || e == ENOMEM) {
                /* Linux reports EMFILE before it looks at the queue: is anyone waiting at all? */
                struct pollfd p = {S->lfd, POLLIN, 0};
                if (poll(&p, 1, 0) != 1) return;
                int ev = evict_oldest(S, why, &ready);
                if (ev == EVICTED) continue;
                pause_listener(S, ev == TOO_YOUNG ? ready : ts_time_now() + ACCEPT_PAUSE_S, why);
                return;
            }
            pause_listener(S, ts_time_now() + ACCEPT_PAUSE_S, why);
            return;
        }
        S->accept_failing = false;
        char addr[64];
        ts__sockaddr_str((struct sockaddr *)&ss, sl, addr, sizeof addr);
        int one = 1;
        (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        if (S->nconns == S->cap) {
            int cap = S->cap ? S->cap * 2 : 16;
            srv_conn **cc = realloc(S->conns, sizeof *cc * (size_t)cap);
            if (!cc) {
                close(fd);
                continue;
            }
            S->conns = cc;
            S->cap = cap;
        }
        srv_conn *c = calloc(1, sizeof *c);
        if (!c || ts__auth_challenge(&S->auth, TS__AUTH_STORE, (uint32_t)S->max_key, (uint32_t)S->max_value,
                                     c->ch) != TS_OK) {
            free(c);
            close(fd);
            continue;
        }
        c->fd = fd;
        c->rank = -1;
        snprintf(c->addr, sizeof c->addr, "%s", addr);
        c->since = ts_time_now();
        c->deadline = c->since + S->auth_timeout;
        c->prev = S->unauth_tail;
        if (S->unauth_tail) S->unauth_tail->next = c;
        else S->unauth_head = c;
        S->unauth_tail = c;
        S->conns[S->nconns++] = c;
        S->nlive++;
        /* 48 bytes into a fresh socket's empty buffer: never blocks. */
        if (send(fd, c->ch, sizeof c->ch, MSG_NOSIGNAL | MSG_DONTWAIT) != (ssize_t)sizeof c->ch)
            conn_drop(S, c, "cannot send the challenge: %s", strerror(errno));
    }
}

static int ms_until(double t, double now) {
    double left = t - now;
    if (left <= 0) return 0;
    return left > 86400.0 ? 86400000 : (int)(left * 1000.0) + 1;
}

static void *srv_main(void *arg) {
    tcp_server *S = arg;
    struct pollfd *pf = NULL;
    size_t pcap = 0;
    for (;;) {
        double now = ts_time_now();
        reap_unauthed(S, now);
        size_t np = 2 + (size_t)S->nconns;
        if (np > pcap) {
            size_t cap = np * 2;
            struct pollfd *p = realloc(pf, sizeof *p * cap);
            if (!p) break; /* out of memory: stop; clients see the connections close */
            pf = p;
            pcap = cap;
        }
        bool listening = S->accept_resume <= now;
        pf[0] = (struct pollfd){S->wake[0], POLLIN, 0};
        pf[1] = (struct pollfd){listening ? S->lfd : -1, POLLIN, 0};
        for (int i = 0; i < S->nconns; i++) {
            srv_conn *c = S->conns[i];
            pf[2 + i] = (struct pollfd){c->fd, (short)(POLLIN | (c->out_off < c->out.n ? POLLOUT : 0)), 0};
        }
        int timeout = -1;
        if (S->unauth_head) timeout = ms_until(S->unauth_head->deadline, now);
        if (!listening) {
            int t = ms_until(S->accept_resume, now);
            timeout = timeout < 0 ? t : TS_MIN(timeout, t);
        }
        int r = poll(pf, (nfds_t)np, timeout); /* the self-pipe ends the wait */
        if (r < 0) {
            if (errno == EINTR) continue;
            break;
        }
        if (pf[0].revents) break;
        int n = S->nconns;
        for (int i = 0; i < n; i++) {
            srv_conn *c = S->conns[i];
            short ev = pf[2 + i].revents;
            if (c->dead || !ev) continue;
            if (!c->authed) {
                if (ev & (POLLIN | POLLHUP | POLLERR)) conn_read_auth(S, c);
                continue;
            }
            if (ev & (POLLIN | POLLHUP | POLLERR)) conn_read(S, c);
            if (ev & POLLOUT) conn_flush(S, c);
        }
        if (listening && (pf[1].revents & POLLIN)) srv_accept(S);
        while (S->changed) {
            S->changed = false;
            for (int i = 0; i < S->nconns; i++) {
                srv_conn *c = S->conns[i];
                if (!c->dead && c->parked && conn_try_answer(S, c)) conn_serve(S, c);
            }
        }
        int keep = 0;
        for (int i = 0; i < S->nconns; i++) {
            srv_conn *c = S->conns[i];
            if (!c->dead && c->authed) {
                conn_flush(S, c);
                /* Requests held back while replies were pending. */
                if (!c->dead && !c->parked && c->in.n >= 4 && c->out.n - c->out_off < OUT_HIGH) conn_serve(S, c);
            }
            if (c->dead)
                conn_free(c);
            else
                S->conns[keep++] = c;
        }
        S->nconns = keep;
    }
    free(pf);
    for (int i = 0; i < S->nconns; i++) conn_free(S->conns[i]);
    S->nconns = 0;
    return NULL;
}

static void srv_free(tcp_server *S) {
    if (!S) return;
    free(S->conns);
    free(S->per_rank);
    ts__kv_free(&S->kv);
    ts__auth_wipe(&S->auth);
    if (S->lfd >= 0) close(S->lfd);
    if (S->wake[0] >= 0) close(S->wake[0]);
    if (S->wake[1] >= 0) close(S->wake[1]);
    free(S);
}

static void srv_stop(tcp_server *S) {
    char b = 'x';
    while (write(S->wake[1], &b, 1) < 0 && errno == EINTR) {
    }
    pthread_join(S->thread, NULL);
    srv_free(S);
}

/* The default connection cap: DEFAULT_MAX_CONNS, or 3/4 of the open-file limit when lower. */
static int default_max_conns(void) {
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY) return DEFAULT_MAX_CONNS;
    rlim_t q = rl.rlim_cur / 4 * 3;
    return q < 16 ? 16 : q > DEFAULT_MAX_CONNS ? DEFAULT_MAX_CONNS : (int)q;
}

/* Is host a name (not a numeric address, not "localhost") that resolved to the loopback address a?
 * That is Debian's /etc/hosts line "127.0.1.1 <hostname>": other hosts reach this one by that name at
 * its real address (DNS), so the store must listen on every interface, not on 127.0.1.1. */
static bool loopback_alias(const char *host, const struct addrinfo *a) {
    unsigned char buf[sizeof(struct in6_addr)];
    if (inet_pton(AF_INET, host, buf) == 1 || inet_pton(AF_INET6, host, buf) == 1 || !strcasecmp(host, "localhost"))
        return false;
    if (a->ai_family == AF_INET) return (ntohl(((struct sockaddr_in *)a->ai_addr)->sin_addr.s_addr) >> 24) == 127;
    return a->ai_family == AF_INET6 && IN6_IS_ADDR_LOOPBACK(&((struct sockaddr_in6 *)a->ai_addr)->sin6_addr);
}

/* Binds host:port, listens and starts the thread. *bound gets the address (with the real port).
 * auth and the limits (already resolved) are copied. A host name that resolves to a loopback address
 * (loopback_alias) binds every interface of that family instead. */
/* A listening socket a launcher handed down for this server: `tessera run` binds the store's port itself and
 * passes the socket to rank 0 (TS_STORE_LISTEN_FD=<descriptor>, as systemd's socket activation does), so
 * that no other process can take the port between the launcher's choice and our bind. Taken once per
 * process, and only when it is a listening TCP socket bound to `port`; -1 otherwise (then we bind). */
static int inherited_listener(int port) {
    static atomic_bool taken;
    int64_t fd = ts_env_int(TS_ENV_STORE_LISTEN_FD); /* >= 3; -1 when unset */
    if (fd < 3 || port <= 0 || atomic_load(&taken)) return -1;
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    int acc = 0, type = 0;
    socklen_t al = sizeof acc, tl = sizeof type;
    if (getsockname((int)fd, (struct sockaddr *)&ss, &sl) != 0 ||
        getsockopt((int)fd, SOL_SOCKET, SO_ACCEPTCONN, &acc, &al) != 0 || !acc ||
        getsockopt((int)fd, SOL_SOCKET, SO_TYPE, &type, &tl) != 0 || type != SOCK_STREAM)
        return -1;
    const int bport = ss.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&ss)->sin6_port)
                      : ss.ss_family == AF_INET ? ntohs(((struct sockaddr_in *)&ss)->sin_port)
                                                : -1;
    if (bport != port || atomic_exchange(&taken, true)) return -1;
    (void)fcntl((int)fd, F_SETFD, FD_CLOEXEC); /* not for our own children */
    (void)fcntl((int)fd, F_SETFL, fcntl((int)fd, F_GETFL) | O_NONBLOCK);
    return (int)fd;
}

/* One try at binding host:port (resolved in res) and listening: the socket, or -1 with *err set; *any
 * says whether it listens on every interface for a host name that is a loopback alias here. */
static int bind_listen(const struct addrinfo *res, const char *host, int *err, bool *any_if) {
    int lfd = -1;
    for (const struct addrinfo *ai = res; ai && lfd < 0; ai = ai->ai_next) {
        lfd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (lfd < 0) {
            *err = errno;
            continue;
        }
        int one = 1;
        (void)setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        struct sockaddr_storage any;
        const struct sockaddr *at = ai->ai_addr;
        if (loopback_alias(host, ai)) {
            memset(&any, 0, sizeof any);
            memcpy(&any, ai->ai_addr, ai->ai_addrlen); /* family and port; the address zeroed below */
            if (ai->ai_family == AF_INET) ((struct sockaddr_in *)&any)->sin_addr.s_addr = htonl(INADDR_ANY);
            else ((struct sockaddr_in6 *)&any)->sin6_addr = in6addr_any;
            at = (const struct sockaddr *)&any;
        }
        *any_if = at == (const struct sockaddr *)&any;
        if (bind(lfd, at, ai->ai_addrlen) != 0 || listen(lfd, SOMAXCONN) != 0) {
            *err = errno;
            close(lfd);
            lfd = -1;
        }
    }
    return lfd;
}

/* The listening socket for host:port: bound here, unless a launcher handed one down (inherited_listener).
 * A port in use is tried again for TS__STORE_BIND_RETRY_S: after a restart, the last attempt's server
 * (a rank killed with its launcher) may hold it for a moment longer. */
static ts_status srv_listen(const char *host, int port, const char *hp, int *out) {
    int lfd = inherited_listener(port), err = 0;
    if (lfd >= 0) {
        ts_log(TS_LOG_DEBUG, "tcp store: serving on %s through the listening socket the launcher passed down", hp);
        *out = lfd;
        return TS_OK;
    }
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    int g = getaddrinfo(host, ps, &hints, &res);
    if (g != 0) return ts_error(TS_ERR_IO, "tcp store: cannot listen on %s: cannot resolve '%s': %s", hp, host,
                                gai_strerror(g));
    double until = ts_time_now() + TS__STORE_BIND_RETRY_S;
    bool told = false, any_if = false;
    while ((lfd = bind_listen(res, host, &err, &any_if)) < 0 && err == EADDRINUSE && port > 0 &&
           ts_time_now() < until) {
        if (!told) ts_log(TS_LOG_INFO, "tcp store: %s is in use; trying again for %g s", hp, TS__STORE_BIND_RETRY_S);
        told = true;
        nanosleep(&(struct timespec){0, 100 * 1000 * 1000}, NULL);
    }
    freeaddrinfo(res);
    if (lfd < 0 && err == EADDRINUSE)
        return ts_error(TS_ERR_IO, "tcp store: cannot listen on %s: %s (for %g s: another job on this port? give "
                        "another master port)", hp, strerror(err), TS__STORE_BIND_RETRY_S);
    if (lfd < 0) return ts_error(TS_ERR_IO, "tcp store: cannot listen on %s: %s", hp, strerror(err));
    if (told) ts_log(TS_LOG_INFO, "tcp store: %s is free again", hp);
    if (any_if)
        ts_log(TS_LOG_INFO, "tcp store: %s resolves to a loopback address here (/etc/hosts' 127.0.1.1 line?): "
               "listening on every interface so other hosts reach it", host);
    *out = lfd;
    return TS_OK;
}

static ts_status srv_start(const char *host, int port, const ts__auth *auth, const ts_store_tcp_options *o,
                           tcp_server **out, struct sockaddr_storage *bound, socklen_t *boundlen) {
    char hp[300];
    ts__sock_hostport(hp, sizeof hp, host, port);
    int lfd = -1, err = 0;
    TS_TRY(srv_listen(host, port, hp, &lfd));
    *boundlen = sizeof *bound;
    if (getsockname(lfd, (struct sockaddr *)bound, boundlen) != 0) {
        err = errno;
        close(lfd);
        return ts_error(TS_ERR_IO, "tcp store: getsockname on %s: %s", hp, strerror(err));
    }
    tcp_server *S = calloc(1, sizeof *S);
    if (!S) {
        close(lfd);
        return ts_error(TS_ERR_NOMEM, "tcp store: out of memory");
    }
    S->lfd = lfd;
    S->kv = TS__KV_INIT;
    S->auth = *auth;
    ts__sock_hostport(S->hp, sizeof S->hp, host,
                 ntohs(bound->ss_family == AF_INET6 ? ((struct sockaddr_in6 *)bound)->sin6_port
                                                    : ((struct sockaddr_in *)bound)->sin_port));
    S->max_conns = o->max_connections;
    S->max_key = o->max_key_bytes;
    S->max_value = o->max_value_bytes;
    S->max_frame = S->max_key + S->max_value + FRAME_OVERHEAD;
    S->auth_timeout = o->auth_timeout_s;
    S->max_total = o->max_total_bytes;
    S->max_conn_bytes = o->max_conn_bytes;
    S->world = o->world_size;
    S->wake[0] = S->wake[1] = -1;
    if (S->world > 0 && !(S->per_rank = calloc((size_t)S->world, sizeof *S->per_rank))) {
        srv_free(S);
        return ts_error(TS_ERR_NOMEM, "tcp store: out of memory");
    }
    if (pipe2(S->wake, O_CLOEXEC | O_NONBLOCK) != 0) {
        err = errno;
        S->wake[0] = S->wake[1] = -1;
        srv_free(S);
        return ts_error(TS_ERR_IO, "tcp store: pipe: %s", strerror(err));
    }
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int rc = pthread_create(&S->thread, NULL, srv_main, S);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0) {
        srv_free(S);
        return ts_error(TS_ERR_INTERNAL, "tcp store: cannot start the server thread: %s", strerror(rc));
    }
    *out = S;
    return TS_OK;
}

/* ---- the client store ------------------------------------------------------------------------------ */

typedef struct tcp_store {
    ts_store base;
    char host[256];
    char hp[300]; /* "host:port" for messages */
    int port;
    struct sockaddr_storage addr; /* the server address that answered */
    socklen_t addrlen;
    char local_ip[64]; /* this end of the first connection (numeric) */
    ts__auth auth;
    size_t srv_max_key, srv_max_value; /* the limits the server announced (set by the first connection) */
    ts__sock_pool pool; /* idle connections */
    tcp_server *server; /* rank 0 only */
    int ident_rank, ident_world; /* who this client says it is in its handshakes (-1, 0: nobody) */
} tcp_store;

/* The client's side of the handshake on a fresh connection. TS_OK; *retry set (and why[]
 * filled): the server closed the connection before its verdict (at its limit, or it evicted
 * us: worth another try); any other error is final: refused, or not a store. first: record
 * the limits the server announces. */
static ts_status client_handshake(tcp_store *t, int fd, double deadline, bool first, bool *retry, char *why,
                                  size_t wn) {
    *retry = false;
    double hs_deadline = TS_MIN(deadline, ts_time_now() + CLIENT_HANDSHAKE_S);
    uint8_t ch[TS__AUTH_CHALLENGE_BYTES], resp[TS__AUTH_RESPONSE_BYTES], v[TS__AUTH_VERDICT_BYTES];
    ts__io r = ts__sock_recv(fd, ch, sizeof ch, hs_deadline);
    if (r == TS__IO_OK) {
        uint32_t mk = 0, mv = 0;
        uint32_t f1 = t->ident_rank >= 0 ? (uint32_t)t->ident_rank + 1 : 0, f2 = (uint32_t)t->ident_world;
        int code = ts__auth_respond(&t->auth, TS__AUTH_STORE, ch, f1, f2, &mk, &mv, resp);
        if (code < 0) return (ts_status)code; /* no random bytes: the error is set */
        if (code != TS__AUTH_OK)
            return ts_error(TS_ERR_REMOTE, "tcp store %s: the server's handshake is not understood: %s", t->hp,
                            ts__auth_client_reason(code));
        if (first) {
            t->srv_max_key = mk;
            t->srv_max_value = mv;
        }
        r = ts__sock_send(fd, resp, sizeof resp, hs_deadline);
    }
    if (r == TS__IO_OK) r = ts__sock_recv(fd, v, sizeof v, hs_deadline);
    if (r == TS__IO_CLOSED) {
        *retry = true;
        snprintf(why, wn, "the server closed the connection during authentication (at its connection limit?)");
        return TS_ERR_REMOTE;
    }
    if (r == TS__IO_TIMEOUT) {
        if (ts_time_now() >= deadline)
            return ts_error(TS_ERR_TIMEOUT, "tcp store %s: timed out authenticating with the server", t->hp);
        return ts_error(TS_ERR_REMOTE,
                        "tcp store %s: no handshake from the server within %g s (not a Tessera TCP store, or one "
                        "from before job tokens)",
                        t->hp, CLIENT_HANDSHAKE_S);
    }
    if (r != TS__IO_OK)
        return ts_error(TS_ERR_REMOTE, "tcp store %s: authenticating with the server: %s", t->hp, strerror(errno));
    int code = ts__auth_accepted(&t->auth, ch, resp, v);
    if (code != TS__AUTH_OK)
        return ts_error(TS_ERR_REMOTE, "tcp store %s: authentication failed: %s%s", t->hp,
                        code == TS__AUTH_UNPROVEN ? "the server " : "the server refused this process: ",
                        ts__auth_client_reason(code));
    return TS_OK;
}

/* Records this end's address of a connection (the interface that reaches the server). */
static void note_local_ip(tcp_store *t, int fd) {
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    if (getsockname(fd, (struct sockaddr *)&ss, &sl) != 0) return;
    const void *a = ss.ss_family == AF_INET6 ? (const void *)&((struct sockaddr_in6 *)&ss)->sin6_addr
                                             : (const void *)&((struct sockaddr_in *)&ss)->sin_addr;
    if (!inet_ntop(ss.ss_family, a, t->local_ip, sizeof t->local_ip)) t->local_ip[0] = 0;
}

/* Whether an idle pooled connection was closed by the server meanwhile (evicted, or the server
 * restarted): anything readable on an idle connection is its end. */
static bool idle_gone(int fd) {
    struct pollfd p = {fd, POLLIN, 0};
    return poll(&p, 1, 0) != 0;
}

static ts_status pool_take(tcp_store *t, double deadline, int *fd) {
    while ((*fd = ts__sock_pool_take(&t->pool)) >= 0 && idle_gone(*fd)) close(*fd);
    if (*fd >= 0) return TS_OK;
    /* A new connection, retried with backoff while the server closes it during the handshake. */
    double backoff = 0.01;
    for (;;) {
        int err = 0;
        *fd = ts__sock_connect((const struct sockaddr *)&t->addr, t->addrlen, deadline, &err);
        if (*fd < 0) {
            if (err == ETIMEDOUT)
                return ts_error(TS_ERR_TIMEOUT, "tcp store %s: timed out opening a connection to the server", t->hp);
            return ts_error(TS_ERR_REMOTE, "tcp store %s: cannot reach the server: %s", t->hp, strerror(err));
        }
        bool retry = false;
        char why[160];
        ts_status st = client_handshake(t, *fd, deadline, false, &retry, why, sizeof why);
        if (st == TS_OK) return TS_OK;
        close(*fd);
        *fd = -1;
        if (!retry) return st;
        double left = deadline - ts_time_now();
        if (left <= 0)
            return ts_error(TS_ERR_TIMEOUT, "tcp store %s: timed out opening a connection: %s", t->hp, why);
        ts__sleep_s(TS_MIN(backoff, left));
        backoff = TS_MIN(backoff * 2, 1.0);
    }
}

/* Sends req (a finished frame) and reads the reply body (malloc'd, *body_len bytes, status
 * checked). `what` completes messages: "... timed out after 3 s <what>". */
static ts_status tcp_call(tcp_store *t, ts__wbuf *req, double timeout_s, const char *what, uint8_t **body,
                          size_t *body_len) {
    *body = NULL;
    if (req->oom) return ts_error(TS_ERR_NOMEM, "tcp store: out of memory building a request");
    size_t max_body = t->srv_max_key + t->srv_max_value + FRAME_OVERHEAD;
    if (req->n - 4 > max_body)
        return ts_error(TS_ERR_INVALID_ARG, "tcp store %s: a request of %zu bytes is over the server's limit of %zu %s",
                        t->hp, req->n - 4, max_body, what);
    double deadline = ts_time_now() + timeout_s;
    int fd;
    TS_TRY(pool_take(t, deadline, &fd));
    uint8_t hdr[4];
    ts__io r = ts__sock_send(fd, req->p, req->n, deadline);
    if (r == TS__IO_OK) r = ts__sock_recv(fd, hdr, 4, deadline);
    uint64_t len = r == TS__IO_OK ? ts__get_be(hdr, 4) : 0;
    if (r == TS__IO_OK && (len == 0 || len > MAX_FRAME)) {
        close(fd);
        return ts_error(TS_ERR_REMOTE, "tcp store %s: malformed reply (frame of %llu bytes) %s", t->hp,
                        (unsigned long long)len, what);
    }
    uint8_t *b = NULL;
    if (r == TS__IO_OK) {
        b = malloc((size_t)len);
        if (!b) {
            close(fd);
            return ts_error(TS_ERR_NOMEM, "tcp store: out of memory reading a %llu-byte reply",
                            (unsigned long long)len);
        }
        r = ts__sock_recv(fd, b, (size_t)len, deadline);
    }
    if (r != TS__IO_OK) {
        int e = errno;
        close(fd);
        free(b);
        if (r == TS__IO_TIMEOUT)
            return ts_error(TS_ERR_TIMEOUT, "tcp store %s: timed out after %.3g s %s", t->hp, timeout_s, what);
        if (r == TS__IO_CLOSED)
            return ts_error(TS_ERR_REMOTE, "tcp store %s: the server closed the connection %s", t->hp, what);
        return ts_error(TS_ERR_REMOTE, "tcp store %s: %s %s", t->hp, strerror(e), what);
    }
    ts__sock_pool_put(&t->pool, fd);
    if (b[0] != ST_OK) {
        rbuf rb = {b, len, 1, false};
        size_t ml = 0;
        const uint8_t *m = rb_str(&rb, &ml);
        ts_status st = ts_error(TS_ERR_INVALID_ARG, "tcp store %s: %.*s", t->hp, m ? (int)TS_MIN(ml, 900u) : 13,
                                m ? (const char *)m : "request error");
        free(b);
        return st;
    }
    *body = b;
    *body_len = (size_t)len;
    return TS_OK;
}

/* One request about one key: op, key, then the value (OP_SET) or the delta
 * (OP_ADD). `verb` names the operation in errors ("setting key 'k'"). On
 * TS_OK, *reply (malloc'd, the caller frees) holds the reply body. */
static ts_status key_call(tcp_store *t, uint8_t op, const char *key, const void *value, size_t len, int64_t delta,
                          const char *verb, double timeout_s, uint8_t **reply, size_t *rlen) {
    char what[300];
    snprintf(what, sizeof what, "%s key '%.200s'", verb, key);
    size_t kl = strlen(key);
    if (kl > t->srv_max_key)
        return ts_error(TS_ERR_INVALID_ARG, "tcp store %s: key '%.100s...' of %zu bytes is over the server's limit of %zu",
                        t->hp, key, kl, t->srv_max_key);
    ts__wbuf req = {0};
    wb_frame(&req, op);
    wb_str(&req, key, strlen(key));
    if (op == OP_SET) wb_str(&req, value, len);
    if (op == OP_ADD) ts__wbuf_be(&req, (uint64_t)delta, 8);
    wb_frame_end(&req, 0);
    ts_status st = tcp_call(t, &req, timeout_s, what, reply, rlen);
    free(req.p);
    return st;
}

static ts_status tcp_set(ts_store *s, const char *key, const void *value, size_t len, double timeout_s) {
    tcp_store *t = (tcp_store *)s;
    if (len > t->srv_max_value)
        return ts_error(TS_ERR_INVALID_ARG,
                        "tcp store %s: value of %zu bytes for key '%.200s' is over the server's limit of %zu bytes "
                        "(ts_store_tcp_options.max_value_bytes)",
                        t->hp, len, key, t->srv_max_value);
    uint8_t *b;
    size_t bl;
    ts_status st = key_call(t, OP_SET, key, value, len, 0, "setting", timeout_s, &b, &bl);
    if (st == TS_OK) free(b);
    return st;
}

static ts_status tcp_get(ts_store *s, const char *key, double timeout_s, void **value, size_t *len) {
    tcp_store *t = (tcp_store *)s;
    uint8_t *b;
    size_t bl;
    ts_status st = key_call(t, OP_GET, key, NULL, 0, 0, "waiting for", timeout_s, &b, &bl);
    if (st != TS_OK) return st;
    rbuf rb = {b, bl, 1, false};
    size_t vl = 0;
    const uint8_t *v = rb_str(&rb, &vl);
    if (!v) {
        free(b);
        return ts_error(TS_ERR_REMOTE, "tcp store %s: malformed reply to get of key '%s'", t->hp, key);
    }
    uint8_t *out = ts__malloc(vl + 1);
    if (!out) {
        free(b);
        return TS_ERR_NOMEM;
    }
    memcpy(out, v, vl);
    out[vl] = 0;
    free(b);
    *value = out;
    *len = vl;
    return TS_OK;
}

static ts_status tcp_add(ts_store *s, const char *key, int64_t delta, double timeout_s, int64_t *result) {
    tcp_store *t = (tcp_store *)s;
    uint8_t *b;
    size_t bl;
    ts_status st = key_call(t, OP_ADD, key, NULL, 0, delta, "adding to", timeout_s, &b, &bl);
    if (st != TS_OK) return st;
    rbuf rb = {b, bl, 1, false};
    int64_t v = (int64_t)rb_int(&rb, 8);
    free(b);
    if (rb.bad) return ts_error(TS_ERR_REMOTE, "tcp store %s: malformed reply to add on key '%s'", t->hp, key);
    *result = v;
    return TS_OK;
}

static ts_status tcp_check(ts_store *s, const char *key, double timeout_s, bool *exists) {
    tcp_store *t = (tcp_store *)s;
    uint8_t *b;
    size_t bl;
    ts_status st = key_call(t, OP_CHECK, key, NULL, 0, 0, "checking", timeout_s, &b, &bl);
    if (st != TS_OK) return st;
    rbuf rb = {b, bl, 1, false};
    *exists = rb_int(&rb, 1) != 0;
    free(b);
    if (rb.bad) return ts_error(TS_ERR_REMOTE, "tcp store %s: malformed reply to check of key '%s'", t->hp, key);
    return TS_OK;
}

static ts_status tcp_wait(ts_store *s, const char *const *keys, int nkeys, double timeout_s) {
    tcp_store *t = (tcp_store *)s;
    char what[300];
    snprintf(what, sizeof what, "waiting for key '%.200s'%s", keys[0], nkeys > 1 ? " and others" : "");
    for (int i = 0; i < nkeys; i++)
        if (strlen(keys[i]) > t->srv_max_key)
            return ts_error(TS_ERR_INVALID_ARG,
                            "tcp store %s: key '%.100s...' of %zu bytes is over the server's limit of %zu", t->hp,
                            keys[i], strlen(keys[i]), t->srv_max_key);
    ts__wbuf req = {0};
    wb_frame(&req, OP_WAIT);
    ts__wbuf_be(&req, (uint64_t)nkeys, 4);
    for (int i = 0; i < nkeys; i++) wb_str(&req, keys[i], strlen(keys[i]));
    wb_frame_end(&req, 0);
    uint8_t *b;
    size_t bl;
    ts_status st = tcp_call(t, &req, timeout_s, what, &b, &bl);
    free(req.p);
    free(b);
    if (st != TS_ERR_TIMEOUT || nkeys == 1) return st;
    /* Name the first key still missing (best effort, a short check per key). */
    const char *missing = keys[0];
    for (int i = 0; i < nkeys; i++) {
        bool ex = false;
        if (tcp_check(s, keys[i], TS_MIN(1.0, ts__store_timeout(s)), &ex) != TS_OK) break;
        if (!ex) {
            missing = keys[i];
            break;
        }
    }
    return ts_error(TS_ERR_TIMEOUT, "tcp store %s: timed out after %.3g s waiting for key '%.200s'", t->hp,
                    timeout_s, missing);
}

static void tcp_destroy(ts_store *s) {
    tcp_store *t = (tcp_store *)s;
    ts__sock_pool_destroy(&t->pool);
    if (t->server) srv_stop(t->server);
    ts__auth_wipe(&t->auth);
    free(t);
}

static const ts_store_vtable tcp_vtable = {"tcp", tcp_set, tcp_get, tcp_add, tcp_wait, tcp_check, NULL,
                                           tcp_destroy};

/* sock.h's handshake hook: the first connection records the limits the server announces. */
static ts_status first_hello(void *ctx, int fd, double deadline, bool *retry, char *why, size_t wn) {
    return client_handshake(ctx, fd, deadline, true, retry, why, wn);
}

/* The first connection: resolve and connect, retrying with backoff until the deadline. */
static ts_status tcp_first_connect(tcp_store *t, double timeout_s) {
    int fd = -1;
    TS_TRY(ts__sock_dial("tcp store", t->host, t->port, timeout_s, first_hello, t, &fd, &t->addr, &t->addrlen));
    note_local_ip(t, fd);
    ts__sock_pool_put(&t->pool, fd);
    return TS_OK;
}

/* Checks the options and fills in the defaults. */
static ts_status resolve_options(const ts_store_tcp_options *in, ts_store_tcp_options *o) {
    *o = TS_STORE_TCP_OPTIONS_INIT;
    const size_t v1 = offsetof(ts_store_tcp_options, max_total_bytes);
    if (in) {
        bool is_v1 = in->size == v1 && in->version == 1;
        if ((in->size != sizeof *o && !is_v1) || in->magic != TS_STORE_TCP_OPTIONS_MAGIC)
            return ts_error(TS_ERR_INVALID_ARG,
                            "ts_store_tcp_options: size %zu / magic 0x%08x do not match (initialise the options with "
                            "TS_STORE_TCP_OPTIONS_INIT)",
                            in->size, in->magic);
        if (!is_v1 && in->version != TS_STORE_TCP_OPTIONS_VERSION)
            return ts_error(TS_ERR_INVALID_ARG, "ts_store_tcp_options.version is %u; this library supports versions 1 "
                            "and %u", in->version, TS_STORE_TCP_OPTIONS_VERSION);
        memcpy(o, in, is_v1 ? v1 : sizeof *o);
        o->size = sizeof *o;
        o->version = TS_STORE_TCP_OPTIONS_VERSION;
    }
    TS_ARG(o->world_size >= 0 && o->world_size <= TS_DIST_MAX_WORLD_SIZE,
           "ts_store_tcp_options.world_size is %d (expected 0 for unknown, or 1..%d)", o->world_size,
           TS_DIST_MAX_WORLD_SIZE);
    TS_ARG(o->rank >= -1 && (o->world_size == 0 || o->rank < o->world_size),
           "ts_store_tcp_options.rank is %d (expected -1, or 0..world_size-1 = %d)", o->rank, o->world_size - 1);
    TS_ARG(o->max_connections == 0 || o->max_connections >= 2,
           "ts_store_tcp_options.max_connections is %d (expected 0 for the default, or >= 2)", o->max_connections);
    TS_ARG(!isnan(o->auth_timeout_s) && o->auth_timeout_s >= 0,
           "ts_store_tcp_options.auth_timeout_s is %g (expected 0 for the default, or > 0)", o->auth_timeout_s);
    if (o->max_connections == 0) o->max_connections = default_max_conns();
    if (o->max_key_bytes == 0) o->max_key_bytes = DEFAULT_MAX_KEY;
    if (o->max_value_bytes == 0) o->max_value_bytes = DEFAULT_MAX_VALUE;
    if (o->auth_timeout_s == 0) o->auth_timeout_s = DEFAULT_AUTH_TIMEOUT_S;
    if (o->max_total_bytes == 0) o->max_total_bytes = DEFAULT_TOTAL_BASE + DEFAULT_TOTAL_PER_RANK * (size_t)o->world_size;
    if (o->max_conn_bytes == 0) o->max_conn_bytes = TS_MIN(2 * o->max_value_bytes, o->max_total_bytes);
    TS_ARG(o->max_key_bytes <= MAX_FRAME && o->max_value_bytes <= MAX_FRAME &&
               o->max_key_bytes + o->max_value_bytes + FRAME_OVERHEAD <= MAX_FRAME,
           "ts_store_tcp_options: max_key_bytes %zu + max_value_bytes %zu is over the 1 GiB frame limit",
           o->max_key_bytes, o->max_value_bytes);
    return TS_OK;
}

ts_status ts_store_tcp_new(const char *host, int port, bool is_server, double timeout_s, ts_store **out) {
    return ts_store_tcp_new_ex(host, port, is_server, timeout_s, NULL, out);
}

ts_status ts_store_tcp_new_ex(const char *host, int port, bool is_server, double timeout_s,
                              const ts_store_tcp_options *opts, ts_store **out) {
    TS_ARG(host && out, "ts_store_tcp_new: NULL argument");
    TS_ARG(host[0] && strlen(host) < 256, "ts_store_tcp_new: host must be 1 to 255 characters");
    TS_ARG(port >= 0 && port <= 65535, "ts_store_tcp_new: port %d out of range 0..65535", port);
    TS_ARG(port > 0 || is_server, "ts_store_tcp_new: port 0 is only valid for the server");
    *out = NULL;
    ts_store_tcp_options o;
    TS_TRY(resolve_options(opts, &o));
    char hp[300];
    ts__sock_hostport(hp, sizeof hp, host, port);
    char what[320];
    if (is_server && port == 0) snprintf(what, sizeof what, "tcp store on %s", host);
    else snprintf(what, sizeof what, "tcp store %s", hp);
    ts__auth auth;
    TS_TRY(ts__auth_init(&auth, o.token, what));
    tcp_store *t = ts__calloc(1, sizeof *t);
    if (!t) {
        ts__auth_wipe(&auth);
        return TS_ERR_NOMEM;
    }
    snprintf(t->host, sizeof t->host, "%s", host);
    t->port = port;
    t->auth = auth;
    t->ident_rank = o.rank;
    t->ident_world = o.world_size;
    ts__auth_wipe(&auth);
    ts__sock_pool_init(&t->pool);
    ts__store_init(&t->base, &tcp_vtable, timeout_s);
    ts_status st;
    if (is_server) {
        st = srv_start(host, port, &t->auth, &o, &t->server, &t->addr, &t->addrlen);
        if (st == TS_OK) {
            t->port = ntohs(t->addr.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&t->addr)->sin6_port
                                                          : ((struct sockaddr_in *)&t->addr)->sin_port);
            ts__sock_hostport(t->hp, sizeof t->hp, host, t->port);
            t->srv_max_key = o.max_key_bytes;
            t->srv_max_value = o.max_value_bytes;
            int fd = -1;
            st = pool_take(t, ts_time_now() + ts__store_timeout(&t->base), &fd);
            if (st == TS_OK) {
                note_local_ip(t, fd);
                ts__sock_pool_put(&t->pool, fd);
            }
        }
    } else {
        ts__sock_hostport(t->hp, sizeof t->hp, host, port);
        st = tcp_first_connect(t, ts__store_timeout(&t->base));
    }
    if (st != TS_OK) {
        tcp_destroy(&t->base);
        return st;
    }
    *out = &t->base;
    return TS_OK;
}

int ts_store_tcp_port(const ts_store *s) {
    if (!s || s->vt != &tcp_vtable) return -1;
    return ((const tcp_store *)s)->port;
}

bool ts__store_tcp_job(ts_store *s, ts__auth *auth, char *local_ip, size_t cap) {
    while (s && s->vt != &tcp_vtable) s = ts__store_prefix_inner(s);
    if (!s) return false;
    const tcp_store *t = (const tcp_store *)s;
    *auth = t->auth;
    snprintf(local_ip, cap, "%s", t->local_ip);
    return true;
}
