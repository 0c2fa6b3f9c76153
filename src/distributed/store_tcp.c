/*
 * distributed/store_tcp.c — the TCP store (torch's TCPStore): rank 0 runs a server
 * thread that holds the keys; every rank, rank 0 included, is a client.
 *
 * ---- wire protocol ------------------------------------------------------------------------------
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
 * ---- client ---------------------------------------------------------------------------------------
 * The first connection is retried (getaddrinfo, IPv4 and IPv6, then a non-
 * blocking connect) with backoff from 10 ms doubling to 1 s until the timeout.
 * The store keeps a pool of idle connections: each call takes one (or opens a
 * new one to the address that worked), so threads sharing a store never wait
 * behind each other's parked GET. Every send/recv goes through poll() with the
 * time left before the call's deadline; a connection that timed out or failed
 * is closed, never reused.
 */
#include "distributed/store.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <sys/socket.h>
#include <unistd.h>

enum { OP_SET = 1, OP_GET = 2, OP_ADD = 3, OP_CHECK = 4, OP_WAIT = 5 };
enum { ST_OK = 0, ST_ERROR = 1 };
#define MAX_FRAME (1u << 30)

/* ---- byte helpers ------------------------------------------------------------------------------- */

static void put_be(uint8_t *p, uint64_t v, int n) {
    for (int i = n - 1; i >= 0; i--, v >>= 8) p[i] = (uint8_t)v;
}

static uint64_t get_be(const uint8_t *p, int n) {
    uint64_t v = 0;
    for (int i = 0; i < n; i++) v = v << 8 | p[i];
    return v;
}

/* A growable byte buffer; oom is sticky. */
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

static void wb_int(wbuf *b, uint64_t v, int n) {
    uint8_t t[8];
    put_be(t, v, n);
    wb_put(b, t, (size_t)n);
}

static void wb_str(wbuf *b, const void *d, size_t n) {
    wb_int(b, n, 4);
    wb_put(b, d, n);
}

/* Starts a frame: a length placeholder and the first body byte. */
static void wb_frame(wbuf *b, uint8_t first) {
    b->n = 0;
    wb_int(b, 0, 4);
    wb_put(b, &first, 1);
}

/* Fills in the length of the frame that starts at offset start. */
static void wb_frame_end(wbuf *b, size_t start) {
    if (!b->oom) put_be(b->p + start, b->n - start - 4, 4);
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
    uint64_t v = get_be(r->p + r->off, n);
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

static void fmt_hostport(char *buf, size_t n, const char *host, int port) {
    snprintf(buf, n, strchr(host, ':') ? "[%s]:%d" : "%s:%d", host, port);
}

/* ---- client-side socket I/O with deadlines --------------------------------------------------------- */

enum { IO_OK = 0, IO_TIMEOUT, IO_CLOSED, IO_ERR };

static int io_wait(int fd, short events, double deadline) {
    for (;;) {
        double left = deadline - ts_time_now();
        if (left <= 0) return IO_TIMEOUT;
        int ms = left > 86400.0 ? 86400000 : (int)(left * 1000.0) + 1;
        struct pollfd p = {fd, events, 0};
        int r = poll(&p, 1, ms);
        if (r < 0 && errno != EINTR) return IO_ERR;
        if (r > 0) return IO_OK; /* ready, or an error/hangup the next send/recv reports */
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

/* One non-blocking connect attempt, bounded by deadline. Returns the fd or -1 with *err. */
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

/* ---- the server --------------------------------------------------------------------------------------- */

typedef struct srv_conn {
    int fd;
    wbuf in, out;
    size_t out_off;
    uint8_t parked; /* 0, OP_GET or OP_WAIT */
    char **keys;    /* the parked request's keys */
    int nkeys;
    bool dead;
} srv_conn;

typedef struct tcp_server {
    int lfd;
    int wake[2];
    pthread_t thread;
    ts__kv kv;
    srv_conn **conns;
    int nconns, cap;
    bool changed; /* a SET/ADD happened: re-examine parked requests */
} tcp_server;

static void conn_unpark(srv_conn *c) {
    for (int i = 0; i < c->nkeys; i++) free(c->keys[i]);
    free(c->keys);
    c->keys = NULL;
    c->nkeys = 0;
    c->parked = 0;
}

static void conn_free(srv_conn *c) {
    close(c->fd);
    conn_unpark(c);
    free(c->in.p);
    free(c->out.p);
    free(c);
}

/* Reads a key from r: a NUL-terminated copy; NULL if malformed, holding a NUL, or out of memory. */
static char *rb_key(rbuf *r) {
    size_t n = 0;
    const uint8_t *p = rb_str(r, &n);
    if (!p || memchr(p, 0, n)) return NULL;
    char *k = malloc(n + 1);
    if (!k) return NULL;
    memcpy(k, p, n);
    k[n] = 0;
    return k;
}

static void reply_status(srv_conn *c, uint8_t st) {
    size_t start = c->out.n;
    wb_int(&c->out, 0, 4);
    wb_put(&c->out, &st, 1);
    wb_frame_end(&c->out, start);
}

/* Answers a parked request if its keys exist now. Returns true if it did. */
static bool conn_try_answer(tcp_server *S, srv_conn *c) {
    for (int i = 0; i < c->nkeys; i++)
        if (!ts__kv_find(&S->kv, c->keys[i])) return false;
    size_t start = c->out.n;
    uint8_t ok = ST_OK;
    wb_int(&c->out, 0, 4);
    wb_put(&c->out, &ok, 1);
    if (c->parked == OP_GET) {
        ts__kv_entry *e = ts__kv_find(&S->kv, c->keys[0]);
        wb_str(&c->out, e->value, e->len);
    }
    wb_frame_end(&c->out, start);
    conn_unpark(c);
    return true;
}

/* Executes one request body. Returns false if the connection must close. */
static bool conn_request(tcp_server *S, srv_conn *c, const uint8_t *body, size_t n) {
    rbuf r = {body, n, 0, false};
    uint8_t op = (uint8_t)rb_int(&r, 1);
    size_t vl = 0;
    switch (op) {
    case OP_SET: {
        char *key = rb_key(&r);
        const uint8_t *v = rb_str(&r, &vl);
        bool ok = key && !r.bad && ts__kv_set(&S->kv, key, v, vl) == TS_OK;
        free(key);
        if (!ok) return false;
        S->changed = true;
        reply_status(c, ST_OK);
        return true;
    }
    case OP_ADD: {
        char *key = rb_key(&r);
        int64_t delta = (int64_t)rb_int(&r, 8), result = 0;
        if (!key || r.bad) {
            free(key);
            return false;
        }
        ts_status st = ts__kv_add(&S->kv, key, delta, &result);
        free(key);
        size_t start = c->out.n;
        if (st == TS_OK) {
            S->changed = true;
            uint8_t ok = ST_OK;
            wb_int(&c->out, 0, 4);
            wb_put(&c->out, &ok, 1);
            wb_int(&c->out, (uint64_t)result, 8);
        } else {
            uint8_t err = ST_ERROR;
            const char *msg = ts_last_error();
            wb_int(&c->out, 0, 4);
            wb_put(&c->out, &err, 1);
            wb_str(&c->out, msg, strlen(msg));
        }
        wb_frame_end(&c->out, start);
        return true;
    }
    case OP_CHECK: {
        char *key = rb_key(&r);
        if (!key || r.bad) {
            free(key);
            return false;
        }
        uint8_t ex = ts__kv_find(&S->kv, key) != NULL, ok = ST_OK;
        free(key);
        size_t start = c->out.n;
        wb_int(&c->out, 0, 4);
        wb_put(&c->out, &ok, 1);
        wb_put(&c->out, &ex, 1);
        wb_frame_end(&c->out, start);
        return true;
    }
    case OP_GET:
    case OP_WAIT: {
        uint64_t nk = op == OP_GET ? 1 : rb_int(&r, 4);
        if (r.bad || nk == 0 || nk > n) return false; /* each key takes >= 4 bytes */
        c->keys = calloc((size_t)nk, sizeof *c->keys);
        if (!c->keys) return false;
        c->parked = op;
        for (uint64_t i = 0; i < nk; i++) {
            c->keys[i] = rb_key(&r);
            if (!c->keys[i]) return false; /* conn_free releases the partial list */
            c->nkeys++;
        }
        conn_try_answer(S, c);
        return true;
    }
    default:
        return false;
    }
}

/* Executes every complete buffered frame while no request is parked. */
static void conn_serve(tcp_server *S, srv_conn *c) {
    size_t pos = 0;
    while (!c->dead && !c->parked && c->in.n - pos >= 4) {
        uint64_t len = get_be(c->in.p + pos, 4);
        if (len == 0 || len > MAX_FRAME) {
            c->dead = true;
            break;
        }
        if (c->in.n - pos - 4 < len) break;
        if (!conn_request(S, c, c->in.p + pos + 4, (size_t)len)) c->dead = true;
        pos += 4 + (size_t)len;
    }
    if (pos) {
        memmove(c->in.p, c->in.p + pos, c->in.n - pos);
        c->in.n -= pos;
    }
    if (c->out.oom || c->in.oom) c->dead = true;
}

static void conn_read(tcp_server *S, srv_conn *c) {
    uint8_t buf[65536];
    for (;;) {
        ssize_t r = recv(c->fd, buf, sizeof buf, 0);
        if (r > 0) {
            wb_put(&c->in, buf, (size_t)r);
            if (c->in.oom) break;
            continue;
        }
        if (r < 0 && errno == EINTR) continue;
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
        c->dead = true; /* EOF or error: the client went away */
        return;
    }
    conn_serve(S, c);
}

static void conn_flush(srv_conn *c) {
    while (!c->dead && c->out_off < c->out.n) {
        ssize_t w = send(c->fd, c->out.p + c->out_off, c->out.n - c->out_off, MSG_NOSIGNAL);
        if (w > 0) {
            c->out_off += (size_t)w;
        } else if (w < 0 && errno == EINTR) {
            continue;
        } else if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            return;
        } else {
            c->dead = true;
        }
    }
    if (c->out_off == c->out.n) c->out_off = c->out.n = 0;
}

static void srv_accept(tcp_server *S) {
    for (;;) {
        int fd = accept4(S->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED) continue;
            return; /* EAGAIN, or out of fds: try again on the next wakeup */
        }
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
        if (!c) {
            close(fd);
            continue;
        }
        c->fd = fd;
        S->conns[S->nconns++] = c;
    }
}

static void *srv_main(void *arg) {
    tcp_server *S = arg;
    struct pollfd *pf = NULL;
    size_t pcap = 0;
    for (;;) {
        size_t np = 2 + (size_t)S->nconns;
        if (np > pcap) {
            size_t cap = np * 2;
            struct pollfd *p = realloc(pf, sizeof *p * cap);
            if (!p) break; /* out of memory: stop; clients see the connections close */
            pf = p;
            pcap = cap;
        }
        pf[0] = (struct pollfd){S->wake[0], POLLIN, 0};
        pf[1] = (struct pollfd){S->lfd, POLLIN, 0};
        for (int i = 0; i < S->nconns; i++) {
            srv_conn *c = S->conns[i];
            pf[2 + i] = (struct pollfd){c->fd, (short)(POLLIN | (c->out_off < c->out.n ? POLLOUT : 0)), 0};
        }
        int r = poll(pf, (nfds_t)np, -1); /* the self-pipe ends the wait */
        if (r < 0) {
            if (errno == EINTR) continue;
            break;
        }
        if (pf[0].revents) break;
        int n = S->nconns;
        for (int i = 0; i < n; i++) {
            srv_conn *c = S->conns[i];
            short ev = pf[2 + i].revents;
            if (ev & (POLLIN | POLLHUP | POLLERR)) conn_read(S, c);
            if (ev & POLLOUT) conn_flush(c);
        }
        if (pf[1].revents & POLLIN) srv_accept(S);
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
            conn_flush(c);
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
    ts__kv_free(&S->kv);
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

/* Binds host:port, listens and starts the thread. *bound gets the address (with the real port). */
static ts_status srv_start(const char *host, int port, tcp_server **out, struct sockaddr_storage *bound,
                           socklen_t *boundlen) {
    char hp[300], ps[16];
    fmt_hostport(hp, sizeof hp, host, port);
    snprintf(ps, sizeof ps, "%d", port);
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    int g = getaddrinfo(host, ps, &hints, &res);
    if (g != 0) return ts_error(TS_ERR_IO, "tcp store: cannot listen on %s: cannot resolve '%s': %s", hp, host,
                                gai_strerror(g));
    int lfd = -1, err = 0;
    for (struct addrinfo *ai = res; ai && lfd < 0; ai = ai->ai_next) {
        lfd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (lfd < 0) {
            err = errno;
            continue;
        }
        int one = 1;
        (void)setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(lfd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(lfd, SOMAXCONN) != 0) {
            err = errno;
            close(lfd);
            lfd = -1;
        }
    }
    freeaddrinfo(res);
    if (lfd < 0) return ts_error(TS_ERR_IO, "tcp store: cannot listen on %s: %s", hp, strerror(err));
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
    pthread_mutex_t mu; /* guards the pool */
    int *pool;
    int npool, cap;
    tcp_server *server; /* rank 0 only */
} tcp_store;

static void pool_put(tcp_store *t, int fd) {
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

static ts_status pool_take(tcp_store *t, double deadline, int *fd) {
    pthread_mutex_lock(&t->mu);
    *fd = t->npool ? t->pool[--t->npool] : -1;
    pthread_mutex_unlock(&t->mu);
    if (*fd >= 0) return TS_OK;
    int err = 0;
    *fd = connect_one((const struct sockaddr *)&t->addr, t->addrlen, deadline, &err);
    if (*fd >= 0) return TS_OK;
    if (err == ETIMEDOUT)
        return ts_error(TS_ERR_TIMEOUT, "tcp store %s: timed out opening a connection to the server", t->hp);
    return ts_error(TS_ERR_REMOTE, "tcp store %s: cannot reach the server: %s", t->hp, strerror(err));
}

/* Sends req (a finished frame) and reads the reply body (malloc'd, *body_len bytes, status
 * checked). `what` completes messages: "... timed out after 3 s <what>". */
static ts_status tcp_call(tcp_store *t, wbuf *req, double timeout_s, const char *what, uint8_t **body,
                          size_t *body_len) {
    *body = NULL;
    if (req->oom) return ts_error(TS_ERR_NOMEM, "tcp store: out of memory building a request");
    double deadline = ts_time_now() + timeout_s;
    int fd;
    TS_TRY(pool_take(t, deadline, &fd));
    uint8_t hdr[4];
    int r = io_send(fd, req->p, req->n, deadline);
    if (r == IO_OK) r = io_recv(fd, hdr, 4, deadline);
    uint64_t len = r == IO_OK ? get_be(hdr, 4) : 0;
    if (r == IO_OK && (len == 0 || len > MAX_FRAME)) {
        close(fd);
        return ts_error(TS_ERR_REMOTE, "tcp store %s: malformed reply (frame of %llu bytes) %s", t->hp,
                        (unsigned long long)len, what);
    }
    uint8_t *b = NULL;
    if (r == IO_OK) {
        b = malloc((size_t)len);
        if (!b) {
            close(fd);
            return ts_error(TS_ERR_NOMEM, "tcp store: out of memory reading a %llu-byte reply",
                            (unsigned long long)len);
        }
        r = io_recv(fd, b, (size_t)len, deadline);
    }
    if (r != IO_OK) {
        int e = errno;
        close(fd);
        free(b);
        if (r == IO_TIMEOUT)
            return ts_error(TS_ERR_TIMEOUT, "tcp store %s: timed out after %.3g s %s", t->hp, timeout_s, what);
        if (r == IO_CLOSED)
            return ts_error(TS_ERR_REMOTE, "tcp store %s: the server closed the connection %s", t->hp, what);
        return ts_error(TS_ERR_REMOTE, "tcp store %s: %s %s", t->hp, strerror(e), what);
    }
    pool_put(t, fd);
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
    wbuf req = {0};
    wb_frame(&req, op);
    wb_str(&req, key, strlen(key));
    if (op == OP_SET) wb_str(&req, value, len);
    if (op == OP_ADD) wb_int(&req, (uint64_t)delta, 8);
    wb_frame_end(&req, 0);
    ts_status st = tcp_call(t, &req, timeout_s, what, reply, rlen);
    free(req.p);
    return st;
}

static ts_status tcp_set(ts_store *s, const char *key, const void *value, size_t len, double timeout_s) {
    tcp_store *t = (tcp_store *)s;
    if (len > MAX_FRAME - strlen(key) - 16)
        return ts_error(TS_ERR_INVALID_ARG, "tcp store %s: value of %zu bytes for key '%.200s' is over the 1 GiB limit",
                        t->hp, len, key);
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
    wbuf req = {0};
    wb_frame(&req, OP_WAIT);
    wb_int(&req, (uint64_t)nkeys, 4);
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
    for (int i = 0; i < t->npool; i++) close(t->pool[i]);
    free(t->pool);
    if (t->server) srv_stop(t->server);
    pthread_mutex_destroy(&t->mu);
    free(t);
}

static const ts_store_vtable tcp_vtable = {"tcp", tcp_set, tcp_get, tcp_add, tcp_wait, tcp_check, NULL,
                                           tcp_destroy};

/* The first connection: resolve and connect, retrying with backoff until the deadline. */
static ts_status tcp_first_connect(tcp_store *t, double timeout_s) {
    double deadline = ts_time_now() + timeout_s, backoff = 0.01;
    char ps[16], last[160] = "no attempt made";
    bool have_err = false;
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
            have_err = true;
        } else {
            for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
                int err = 0;
                int fd = connect_one(ai->ai_addr, ai->ai_addrlen, deadline, &err);
                if (fd >= 0) {
                    memcpy(&t->addr, ai->ai_addr, ai->ai_addrlen);
                    t->addrlen = ai->ai_addrlen;
                    freeaddrinfo(res);
                    pool_put(t, fd);
                    return TS_OK;
                }
                if (err != ETIMEDOUT || !have_err) snprintf(last, sizeof last, "%s", strerror(err)); /* keep "refused" */
                have_err = true;
            }
            freeaddrinfo(res);
        }
        double left = deadline - ts_time_now();
        if (left <= 0) break;
        ts__sleep_s(TS_MIN(backoff, left));
        backoff = TS_MIN(backoff * 2, 1.0);
    }
    return ts_error(TS_ERR_TIMEOUT, "tcp store: cannot connect to %s: no server after waiting %.3g s (last error: %s)",
                    t->hp, timeout_s, last);
}

ts_status ts_store_tcp_new(const char *host, int port, bool is_server, double timeout_s, ts_store **out) {
    TS_ARG(host && out, "ts_store_tcp_new: NULL argument");
    TS_ARG(host[0] && strlen(host) < 256, "ts_store_tcp_new: host must be 1 to 255 characters");
    TS_ARG(port >= 0 && port <= 65535, "ts_store_tcp_new: port %d out of range 0..65535", port);
    TS_ARG(port > 0 || is_server, "ts_store_tcp_new: port 0 is only valid for the server");
    *out = NULL;
    tcp_store *t = ts__calloc(1, sizeof *t);
    if (!t) return TS_ERR_NOMEM;
    snprintf(t->host, sizeof t->host, "%s", host);
    t->port = port;
    pthread_mutex_init(&t->mu, NULL);
    ts__store_init(&t->base, &tcp_vtable, timeout_s);
    ts_status st;
    if (is_server) {
        st = srv_start(host, port, &t->server, &t->addr, &t->addrlen);
        if (st == TS_OK) {
            t->port = ntohs(t->addr.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&t->addr)->sin6_port
                                                          : ((struct sockaddr_in *)&t->addr)->sin_port);
            fmt_hostport(t->hp, sizeof t->hp, host, t->port);
            int fd = -1;
            st = pool_take(t, ts_time_now() + ts__store_timeout(&t->base), &fd);
            if (st == TS_OK) pool_put(t, fd);
        }
    } else {
        fmt_hostport(t->hp, sizeof t->hp, host, port);
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
