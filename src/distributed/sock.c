/*
 * distributed/sock.c — client-side socket I/O with deadlines, the first connection with
 * retries, a pool of idle connections and a byte buffer (see sock.h).
 */
#include "distributed/sock.h"
#include "distributed/store.h" /* ts__sleep_s */

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <unistd.h>

/* ---- I/O with deadlines ------------------------------------------------------------------------ */

ts__io ts__sock_wait(int fd, short events, double deadline) {
    for (;;) {
        double left = deadline - ts_time_now();
        if (left <= 0) return TS__IO_TIMEOUT;
        int ms = left > 86400.0 ? 86400000 : (int)(left * 1000.0) + 1;
        struct pollfd p = {fd, events, 0};
        int r = poll(&p, 1, ms);
        if (r < 0 && errno != EINTR) return TS__IO_ERR;
        if (r > 0) return TS__IO_OK; /* ready, or an error/hangup the next send/recv reports */
    }
}

ts__io ts__sock_send(int fd, const void *buf, size_t n, double deadline) {
    const uint8_t *p = buf;
    while (n) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w > 0) {
            p += w;
            n -= (size_t)w;
        } else if (w < 0 && errno == EINTR) {
            continue;
        } else if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            ts__io r = ts__sock_wait(fd, POLLOUT, deadline);
            if (r != TS__IO_OK) return r;
        } else {
            return (errno == EPIPE || errno == ECONNRESET) ? TS__IO_CLOSED : TS__IO_ERR;
        }
    }
    return TS__IO_OK;
}

ts__io ts__sock_recv(int fd, void *buf, size_t n, double deadline) {
    uint8_t *p = buf;
    while (n) {
        ssize_t r = recv(fd, p, n, MSG_DONTWAIT);
        if (r > 0) {
            p += r;
            n -= (size_t)r;
        } else if (r == 0) {
            return TS__IO_CLOSED;
        } else if (errno == EINTR) {
            continue;
        } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
            ts__io w = ts__sock_wait(fd, POLLIN, deadline);
            if (w != TS__IO_OK) return w;
        } else {
            return errno == ECONNRESET ? TS__IO_CLOSED : TS__IO_ERR;
        }
    }
    return TS__IO_OK;
}

int ts__sock_connect(const struct sockaddr *sa, socklen_t salen, double deadline, int *err) {
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
        ts__io r = ts__sock_wait(fd, POLLOUT, deadline);
        int soerr = 0;
        socklen_t sl = sizeof soerr;
        if (r == TS__IO_OK && getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) != 0) soerr = errno;
        if (r != TS__IO_OK || soerr) {
            *err = r == TS__IO_TIMEOUT ? ETIMEDOUT : r == TS__IO_ERR ? errno : soerr;
            close(fd);
            return -1;
        }
    }
    int one = 1;
    (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return fd;
}

void ts__sock_hostport(char *buf, size_t n, const char *host, int port) {
    snprintf(buf, n, strchr(host, ':') ? "[%s]:%d" : "%s:%d", host, port);
}

/* One pass over host's addresses. 1: connected (*fd, *addr); 0: nothing answered (last[]
 * says why; *retry_hello when a server asked us to come back); -1: hello's final error. */
static int dial_once(const char *host, const char *ps, double deadline, ts__sock_hello hello, void *ctx, int *fd,
                     struct sockaddr_storage *addr, socklen_t *addrlen, char *last, size_t lastn, bool *have_err,
                     ts_status *final) {
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV;
    int g = getaddrinfo(host, ps, &hints, &res);
    if (g != 0) {
        snprintf(last, lastn, "cannot resolve '%.100s': %s", host, gai_strerror(g));
        *have_err = true;
        return 0;
    }
    for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
        int err = 0;
        int c = ts__sock_connect(ai->ai_addr, ai->ai_addrlen, deadline, &err);
        if (c < 0) {
            if (err != ETIMEDOUT || !*have_err) snprintf(last, lastn, "%s", strerror(err)); /* keep "refused" */
            *have_err = true;
            continue;
        }
        bool retry = false;
        ts_status st = hello ? hello(ctx, c, deadline, &retry, last, lastn) : TS_OK;
        if (st == TS_OK) {
            memcpy(addr, ai->ai_addr, ai->ai_addrlen);
            *addrlen = ai->ai_addrlen;
            *fd = c;
            freeaddrinfo(res);
            return 1;
        }
        close(c);
        if (!retry) { /* refused, or not this protocol: final */
            freeaddrinfo(res);
            *final = st;
            return -1;
        }
        *have_err = true;
        break; /* the server is there but full: back off */
    }
    freeaddrinfo(res);
    return 0;
}

ts_status ts__sock_dial(const char *what, const char *host, int port, double timeout_s, ts__sock_hello hello,
                        void *ctx, int *fd, struct sockaddr_storage *addr, socklen_t *addrlen) {
    char ps[16], last[160] = "no attempt made";
    snprintf(ps, sizeof ps, "%d", port);
    double deadline = ts_time_now() + timeout_s, backoff = 0.01;
    bool have_err = false;
    *fd = -1;
    for (;;) {
        ts_status final = TS_OK;
        int r = dial_once(host, ps, deadline, hello, ctx, fd, addr, addrlen, last, sizeof last, &have_err, &final);
        if (r > 0) return TS_OK;
        if (r < 0) return final;
        double left = deadline - ts_time_now();
        if (left <= 0) break;
        ts__sleep_s(TS_MIN(backoff, left));
        backoff = TS_MIN(backoff * 2, 1.0);
    }
    char hp[300];
    ts__sock_hostport(hp, sizeof hp, host, port);
    return ts_error(TS_ERR_TIMEOUT, "%s: cannot connect to %s: nothing answered within %.3g s (last error: %s)", what,
                    hp, timeout_s, last);
}

/* ---- the pool of idle connections ------------------------------------------------------------- */

void ts__sock_pool_init(ts__sock_pool *p) {
    memset(p, 0, sizeof *p);
    pthread_mutex_init(&p->mu, NULL);
}

void ts__sock_pool_destroy(ts__sock_pool *p) {
    for (int i = 0; i < p->n; i++) close(p->fd[i]);
    free(p->fd);
    p->fd = NULL;
    p->n = p->cap = 0;
    pthread_mutex_destroy(&p->mu);
}

void ts__sock_pool_put(ts__sock_pool *p, int fd) {
    pthread_mutex_lock(&p->mu);
    if (p->n == p->cap) {
        int cap = p->cap ? p->cap * 2 : 8;
        int *f = realloc(p->fd, sizeof *f * (size_t)cap);
        if (!f) {
            pthread_mutex_unlock(&p->mu);
            close(fd);
            return;
        }
        p->fd = f;
        p->cap = cap;
    }
    p->fd[p->n++] = fd;
    pthread_mutex_unlock(&p->mu);
}

int ts__sock_pool_take(ts__sock_pool *p) {
    pthread_mutex_lock(&p->mu);
    int fd = p->n ? p->fd[--p->n] : -1;
    pthread_mutex_unlock(&p->mu);
    return fd;
}

/* ---- the byte buffer ------------------------------------------------------------------------------ */

void ts__wbuf_put(ts__wbuf *b, const void *d, size_t n) {
    if (b->oom) return;
    if (n > SIZE_MAX - b->n) {
        b->oom = true;
        return;
    }
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->n + n) cap = cap > SIZE_MAX / 2 ? b->n + n : cap * 2;
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

bool ts__wbuf_reserve(ts__wbuf *b, size_t n) {
    if (n <= b->cap) return true;
    uint8_t *p = realloc(b->p, n);
    if (!p) {
        b->oom = true;
        return false;
    }
    b->p = p;
    b->cap = n;
    return true;
}

void ts__wbuf_be(ts__wbuf *b, uint64_t v, int nbytes) {
    uint8_t t[8];
    ts__put_be(t, v, nbytes);
    ts__wbuf_put(b, t, (size_t)nbytes);
}

void ts__wbuf_le(ts__wbuf *b, uint64_t v, int nbytes) {
    uint8_t t[8];
    ts__put_le(t, v, nbytes);
    ts__wbuf_put(b, t, (size_t)nbytes);
}
