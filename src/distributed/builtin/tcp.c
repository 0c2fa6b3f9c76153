/*
 * distributed/builtin/tcp.c — the TCP transport: one socket per pair of ranks
 * (the higher rank connects to the lower one's listening socket), TCP_NODELAY,
 * non-blocking; the algorithms poll() the sockets while they wait. A reducing
 * receive reads into a 256 KiB staging buffer and combines whole f32 elements
 * into the destination, carrying a partial element to the next call. EOF,
 * ECONNRESET or EPIPE is TS_ERR_REMOTE naming the peer rank.
 *
 * Who may connect. Every link starts with the job-token handshake of
 * distributed/auth.h (kind 2, link): the listener's challenge names its rank
 * and the world size, the connecting rank answers with its own rank and its
 * HMAC, the listener's verdict carries its proof. The connecting rank checks
 * that proof (and that the listener is the rank it meant to reach) before it
 * sends any data; the listener takes only ranks above its own that it has not
 * linked yet. The token is the group store's when that is a TCP store (so an
 * explicit ts_store_tcp_options.token covers the links too), else TS_JOB_TOKEN.
 *
 * Where it listens: the address of the interface named by TS_SOCKET_IFNAME
 * (NCCL_SOCKET_IFNAME's syntax), else TS_DIST_IFADDR, else the local end of the
 * store's connection to rank 0, else the route to MASTER_ADDR, else 127.0.0.1
 * — one address, never 0.0.0.0 (except for a TS_DIST_IFADDR that is not a
 * local address, behind NAT). The listener lives only while the group
 * connects. Handshakes run concurrently (up to 64; a new connection evicts
 * the oldest once that has had 100 ms to answer; each has 10 s), so silent or slow strangers cannot delay the
 * genuine peers; refused ones are logged with their address (rate-limited);
 * accept() failing with EMFILE takes the listener out of poll() for 100 ms.
 */
#include "distributed/builtin/transport.h"
#include "core/env.h"

#include "distributed/netaddr.h"
#include "distributed/sock.h"
#include "distributed/store.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define STAGE_BYTES (256u << 10)

typedef struct tcp_link {
    ts__link base;
    unsigned char *stage; /* reducing receives; lazily allocated */
    size_t partial;       /* bytes of an incomplete element at stage[0..partial) */
} tcp_link;

static double now_s(void) { return ts_time_now(); }

static int ms_until(double deadline) {
    double left = deadline - now_s();
    if (left <= 0) return 0;
    return left > 1.0 ? 1000 : (int)(left * 1000) + 1;
}

static ts_status remote_err(int peer, int err) {
    if (err == 0) return ts_error(TS_ERR_REMOTE, "rank %d closed the connection (it exited or aborted)", peer);
    return ts_error(TS_ERR_REMOTE, "connection to rank %d failed: %s", peer, strerror(err));
}

static long tcp_try_send(ts__link *l, const void *buf, size_t n) {
    if (n == 0) return 0;
    ssize_t r = send(l->fd, buf, n, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (r >= 0) return (long)r;
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return 0;
    return remote_err(l->peer, errno);
}

static long recv_raw(ts__link *l, void *dst, size_t n) {
    ssize_t r = recv(l->fd, dst, n, MSG_DONTWAIT);
    if (r > 0) return (long)r;
    if (r == 0) return remote_err(l->peer, 0);
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return 0;
    return remote_err(l->peer, errno);
}

static long tcp_try_recv(ts__link *l, void *dst, size_t n, ts__rop op, float scale) {
    if (n == 0) return 0;
    if (op == TS__ROP_COPY) return recv_raw(l, dst, n);
    tcp_link *k = (tcp_link *)l;
    if (!k->stage && !(k->stage = ts__malloc(STAGE_BYTES))) return TS_ERR_NOMEM;
    /* n is a multiple of the element size and the partial bytes belong to this message. */
    size_t es = ts__rop_esize(op), want = TS_MIN(n, (size_t)STAGE_BYTES) - k->partial;
    long r = recv_raw(l, k->stage + k->partial, want);
    if (r <= 0) return r;
    size_t have = k->partial + (size_t)r, whole = have - have % es;
    ts__reduce(dst, k->stage, whole / es, op, scale);
    k->partial = have - whole;
    if (k->partial) memmove(k->stage, k->stage + whole, k->partial);
    return (long)whole;
}

static ts_status tcp_check(ts__link *l) {
    struct pollfd p = {l->fd, POLLIN, 0};
    if (poll(&p, 1, 0) > 0 && (p.revents & (POLLERR | POLLNVAL)))
        return ts_error(TS_ERR_REMOTE, "connection to rank %d failed", l->peer);
    return TS_OK;
}

static void tcp_close(ts__link *l, const char *reason) {
    TS_UNUSED(reason);
    shutdown(l->fd, SHUT_RDWR);
}

static void tcp_destroy(ts__link *l) {
    tcp_link *k = (tcp_link *)l;
    close(l->fd);
    free(k->stage);
    free(k);
}

static const ts__link_vt tcp_vt = {"tcp", tcp_try_send, tcp_try_recv, tcp_check, tcp_close, tcp_destroy};

static ts_status make_link(int fd, int peer, ts__link **out) {
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    int fl = fcntl(fd, F_GETFL, 0);
    fcntl(fd, F_SETFL, fl | O_NONBLOCK);
    tcp_link *k = ts__calloc(1, sizeof *k);
    if (!k) {
        close(fd);
        return TS_ERR_NOMEM;
    }
    k->base.vt = &tcp_vt;
    k->base.peer = peer;
    k->base.fd = fd;
    *out = &k->base;
    return TS_OK;
}

/* ---- job authentication and the listening address ---------------------------------------------------- */

ts_status ts__tcp_job_auth(ts_store *store, ts__auth *auth, char *hint, size_t cap) {
    if (store && ts__store_tcp_job(store, auth, hint, cap)) return TS_OK;
    if (cap) hint[0] = 0;
    return ts__auth_init(auth, NULL, "process group (TCP links)");
}

ts_status ts__tcp_listen(const char *hint, bool cross_host, int *fd_out, char *addr, size_t addr_len) {
    struct sockaddr_storage ss, pub;
    socklen_t sl = 0, pl = 0;
    const char *from = NULL;
    bool published_only = false; /* TS_DIST_IFADDR: peers use that address, which may not be ours */
    TS_TRY(ts__net_local_addr(hint, cross_host, &ss, &sl, &from, &published_only));
    const char *ifaddr = ts_env_str(TS_ENV_DIST_IFADDR);
    ts__net_set_port(&ss, 0);
    pub = ss;
    pl = sl;
    int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) return ts_error(TS_ERR_IO, "listening socket for the process group: socket: %s", strerror(errno));
    int rc = bind(fd, (struct sockaddr *)&ss, sl);
    if (rc != 0 && errno == EADDRNOTAVAIL && published_only) {
        /* TS_DIST_IFADDR names an address peers reach us by that is not ours (NAT): listen on every
         * interface of that family; the handshake still keeps strangers out. */
        ts_log(TS_LOG_WARN, "TS_DIST_IFADDR=%s is not a local address: the process group's listener binds every "
               "interface (use TS_SOCKET_IFNAME to pick one)", ifaddr);
        struct sockaddr_storage any;
        memset(&any, 0, sizeof any);
        any.ss_family = ss.ss_family;
        rc = bind(fd, (struct sockaddr *)&any, sl);
    }
    if (rc != 0 || listen(fd, SOMAXCONN) != 0) {
        char a[80];
        ts__sockaddr_str((struct sockaddr *)&ss, sl, a, sizeof a);
        ts_status st = ts_error(TS_ERR_IO, "listening socket for the process group on %s (%s): %s", a, from,
                                strerror(errno));
        close(fd);
        return st;
    }
    struct sockaddr_storage bound;
    socklen_t bl = sizeof bound;
    if (getsockname(fd, (struct sockaddr *)&bound, &bl) != 0) {
        ts_status st = ts_error(TS_ERR_IO, "listening socket for the process group: getsockname: %s", strerror(errno));
        close(fd);
        return st;
    }
    ts__net_set_port(&pub, ntohs(((struct sockaddr_in *)&bound)->sin_port));
    ts__sockaddr_str((struct sockaddr *)&pub, pl, addr, addr_len);
    *fd_out = fd;
    return TS_OK;
}

/* ---- the handshake ------------------------------------------------------------------------------- */

/* Blocking-style full write/read on a non-blocking socket, bounded by deadline (sock.h). */
static ts__io hio(int fd, void *buf, size_t n, bool wr, double deadline) {
    return wr ? ts__sock_send(fd, buf, n, deadline) : ts__sock_recv(fd, buf, n, deadline);
}

/* One TCP connection to addr (retrying refusals until the deadline) into *fd_out. */
static ts_status dial(const char *addr, int peer, double deadline, int *fd_out) {
    char host[256];
    snprintf(host, sizeof host, "%s", addr);
    char *colon = strrchr(host, ':'), *h = host;
    if (!colon) return ts_error(TS_ERR_FORMAT, "rank %d published a bad address '%s'", peer, addr);
    *colon = 0;
    if (*h == '[' && colon > h + 1 && colon[-1] == ']') { /* "[v6]:port" */
        h++;
        colon[-1] = 0;
    }
    struct addrinfo hints = {0}, *res = NULL;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV;
    int gai = getaddrinfo(h, colon + 1, &hints, &res);
    if (gai != 0 || !res) return ts_error(TS_ERR_IO, "rank %d's address %s: %s", peer, addr, gai_strerror(gai));
    int fd = -1;
    ts_status st = TS_OK;
    for (;;) {
        int err = 0;
        fd = ts__sock_connect(res->ai_addr, res->ai_addrlen, deadline, &err);
        if (fd >= 0) break;
        if (now_s() >= deadline || (err != ECONNREFUSED && err != ETIMEDOUT)) {
            st = ts_error(err == ETIMEDOUT ? TS_ERR_TIMEOUT : TS_ERR_REMOTE, "connecting to rank %d at %s: %s", peer,
                          addr, strerror(err));
            break;
        }
        ts__sleep_s(0.01);
    }
    freeaddrinfo(res);
    *fd_out = fd;
    return st;
}

ts_status ts__tcp_connect(const ts__auth *auth, const char *addr, int rank, int peer, int world, double deadline,
                          ts__link **out) {
    struct timespec backoff = {0, 10 * 1000 * 1000};
    for (;;) {
        int fd = -1;
        TS_TRY(dial(addr, peer, deadline, &fd));
        uint8_t ch[TS__AUTH_CHALLENGE_BYTES], resp[TS__AUTH_RESPONSE_BYTES], v[TS__AUTH_VERDICT_BYTES];
        uint32_t lrank = 0, lworld = 0;
        ts__io r = hio(fd, ch, sizeof ch, false, deadline);
        int code = TS__AUTH_OK;
        if (r == TS__IO_OK) {
            code = ts__auth_respond(auth, TS__AUTH_LINK, ch, (uint32_t)rank, (uint32_t)world, &lrank, &lworld, resp);
            if (code < 0) {
                close(fd);
                return (ts_status)code;
            }
            if (code != TS__AUTH_OK || lrank != (uint32_t)peer || lworld != (uint32_t)world) {
                close(fd);
                if (code != TS__AUTH_OK)
                    return ts_error(TS_ERR_REMOTE, "connecting to rank %d at %s: %s", peer, addr,
                                    ts__auth_client_reason(code));
                return ts_error(TS_ERR_REMOTE,
                                "connecting to rank %d at %s: the listener there says it is rank %u of %u, not rank "
                                "%d of %d (a stale address, or another job)",
                                peer, addr, lrank, lworld, peer, world);
            }
            r = hio(fd, resp, sizeof resp, true, deadline);
        }
        if (r == TS__IO_OK) r = hio(fd, v, sizeof v, false, deadline);
        if (r == TS__IO_OK) {
            code = ts__auth_accepted(auth, ch, resp, v);
            if (code == TS__AUTH_OK) return make_link(fd, peer, out);
            close(fd);
            return ts_error(TS_ERR_REMOTE, "connecting to rank %d at %s: authentication failed: %s%s", peer, addr,
                            code == TS__AUTH_UNPROVEN ? "the listener " : "the listener refused this rank: ",
                            ts__auth_client_reason(code));
        }
        int e = errno;
        close(fd);
        if (r == TS__IO_TIMEOUT || now_s() >= deadline)
            return ts_error(TS_ERR_TIMEOUT, "connecting to rank %d at %s: no handshake in time", peer, addr);
        if (r == TS__IO_ERR) return ts_error(TS_ERR_REMOTE, "connecting to rank %d at %s: %s", peer, addr, strerror(e));
        /* Closed before the verdict: the listener was full of strangers and dropped us. Again. */
        nanosleep(&backoff, NULL);
        if (backoff.tv_nsec < 500 * 1000 * 1000) backoff.tv_nsec *= 2;
    }
}

/* ---- accepting peers -------------------------------------------------------------------------------- */

#define MAX_PENDING 64     /* handshakes in progress at once; a new connection evicts the oldest */
#define ACCEPT_PAUSE_S 0.1 /* the listener leaves poll() this long after EMFILE with nothing to evict */
#define EVICT_MIN_AGE_S 0.1 /* a handshake has this long before a newcomer may evict it */

typedef struct pending {
    int fd;
    double since, deadline;
    size_t n; /* answer bytes received */
    uint8_t ch[TS__AUTH_CHALLENGE_BYTES], hs[TS__AUTH_RESPONSE_BYTES];
    char addr[64];
} pending;

typedef struct acceptor {
    const ts__auth *auth;
    int lfd, rank, world;
    char where[80]; /* this listener's address, for logs */
    pending p[MAX_PENDING];
    int np; /* p[0] is the oldest */
    ts__refusal_log rlog;
} acceptor;

static void pend_refuse(acceptor *A, int i, const char *why) {
    ts__refusal(&A->rlog, "rank %d: refused a connection from %s to the process group's listener %s: %s", A->rank,
                A->p[i].addr, A->where, why);
    close(A->p[i].fd);
    memmove(&A->p[i], &A->p[i + 1], sizeof A->p[0] * (size_t)(A->np - i - 1));
    A->np--;
}

/* Accepts what is waiting (a bounded batch), sending each a challenge. Returns the time
 * until which the listener must stay out of poll() (0: none): it stays readable while a
 * connection waits that cannot be taken yet, and polling it then would spin. A pending
 * handshake is evicted for a newcomer only once it has had EVICT_MIN_AGE_S to answer, so
 * the flood right behind a genuine rank cannot push it out. */
static double accept_some(acceptor *A) {
    for (int k = 0; k < 16; k++) {
        double now = now_s();
        bool evictable = A->np > 0 && now - A->p[0].since >= EVICT_MIN_AGE_S;
        if (A->np == MAX_PENDING) {
            if (!evictable) return A->p[0].since + EVICT_MIN_AGE_S;
            pend_refuse(A, 0, "too many handshakes at once: the oldest makes room");
        }
        struct sockaddr_storage ss;
        socklen_t sl = sizeof ss;
        int fd = accept4(A->lfd, (struct sockaddr *)&ss, &sl, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd < 0) {
            int e = errno;
            if (e == EINTR || e == ECONNABORTED) continue;
            if (e == EAGAIN || e == EWOULDBLOCK) return 0;
            if (e == EMFILE || e == ENFILE || e == ENOBUFS || e == ENOMEM) {
                /* Linux reports EMFILE before it looks at the queue: is anyone waiting at all? */
                struct pollfd q = {A->lfd, POLLIN, 0};
                if (poll(&q, 1, 0) != 1) return 0;
                if (evictable && A->np > 0) {
                    pend_refuse(A, 0, "out of file descriptors: the oldest unauthenticated connection makes room");
                    continue;
                }
                if (A->np > 0) return A->p[0].since + EVICT_MIN_AGE_S;
            }
            ts__refusal(&A->rlog, "rank %d: the process group's listener %s: accept: %s; pausing it for %g s", A->rank,
                        A->where, strerror(e), ACCEPT_PAUSE_S);
            return now + ACCEPT_PAUSE_S;
        }
        pending *p = &A->p[A->np];
        memset(p, 0, sizeof *p);
        p->fd = fd;
        p->since = now_s();
        p->deadline = p->since + TS__AUTH_DEFAULT_TIMEOUT_S;
        ts__sockaddr_str((struct sockaddr *)&ss, sl, p->addr, sizeof p->addr);
        A->np++;
        if (ts__auth_challenge(A->auth, TS__AUTH_LINK, (uint32_t)A->rank, (uint32_t)A->world, p->ch) != TS_OK ||
            send(fd, p->ch, sizeof p->ch, MSG_DONTWAIT | MSG_NOSIGNAL) != (ssize_t)sizeof p->ch)
            pend_refuse(A, A->np - 1, "cannot send the challenge");
    }
    return 0;
}

/* Reads pending i's answer; when complete, checks it and answers. Returns 1 when i became a
 * link (removed from the list), 0 otherwise, < 0 for an error that fails the group. */
static int pend_read(acceptor *A, int i, const bool *expect, ts__link **links) {
    pending *p = &A->p[i];
    uint8_t buf[TS__AUTH_RESPONSE_BYTES + 1];
    ssize_t r = recv(p->fd, buf, sizeof p->hs - p->n + 1, MSG_DONTWAIT);
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return 0;
    if (r <= 0) {
        pend_refuse(A, i, r == 0 ? "it closed the connection during the handshake" : strerror(errno));
        return 0;
    }
    if (p->n + (size_t)r > sizeof p->hs) {
        pend_refuse(A, i, "it sent more than a handshake answer (not a Tessera rank of this version?)");
        return 0;
    }
    memcpy(p->hs + p->n, buf, (size_t)r);
    p->n += (size_t)r;
    if (p->n < sizeof p->hs) return 0;
    uint32_t crank = 0, cworld = 0;
    bool local = A->auth->has_token || ts__peer_is_local(p->fd); /* only asked without a token */
    int code = ts__auth_check(A->auth, TS__AUTH_LINK, p->ch, p->hs, local, &crank, &cworld);
    bool unexpected = code == TS__AUTH_OK &&
                      (cworld != (uint32_t)A->world || crank >= (uint32_t)A->world || !expect[crank] || links[crank]);
    if (unexpected) code = TS__AUTH_BAD_PEER;
    uint8_t v[TS__AUTH_VERDICT_BYTES];
    code = ts__auth_verdict(A->auth, code, p->ch, p->hs, v);
    ssize_t w = send(p->fd, v, sizeof v, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (unexpected) {
        /* It knows the token: a rank of this job out of step (a duplicate rank, another world size). */
        ts_status st = ts_error(TS_ERR_REMOTE,
                                "unexpected connection from rank %u of %u (from %s): this rank expects ranks above "
                                "%d of %d, once each",
                                crank, cworld, p->addr, A->rank, A->world);
        pend_refuse(A, i, "not a rank this listener expects");
        return st;
    }
    if (code != TS__AUTH_OK) {
        pend_refuse(A, i, ts__auth_server_reason(code));
        return 0;
    }
    if (w != (ssize_t)sizeof v) {
        pend_refuse(A, i, "cannot send the verdict");
        return 0;
    }
    int fd = p->fd;
    memmove(&A->p[i], &A->p[i + 1], sizeof A->p[0] * (size_t)(A->np - i - 1));
    A->np--;
    ts_status st = make_link(fd, (int)crank, &links[crank]);
    return st == TS_OK ? 1 : st;
}

ts_status ts__tcp_accept_peers(const ts__auth *auth, int listen_fd, int rank, int world, const bool *expect,
                               double deadline, ts__link **links) {
    acceptor *A = ts__calloc(1, sizeof *A);
    if (!A) return TS_ERR_NOMEM;
    A->auth = auth;
    A->lfd = listen_fd;
    A->rank = rank;
    A->world = world;
    struct sockaddr_storage me;
    socklen_t ml = sizeof me;
    if (getsockname(listen_fd, (struct sockaddr *)&me, &ml) == 0) ts__sockaddr_str((struct sockaddr *)&me, ml, A->where, sizeof A->where);
    int want = 0;
    for (int j = 0; j < world; j++) want += expect[j] && !links[j];
    struct pollfd pf[1 + MAX_PENDING];
    double paused_until = 0;
    ts_status st = TS_OK;
    while (want > 0) {
        double now = now_s();
        while (A->np && A->p[0].deadline <= now) pend_refuse(A, 0, "no handshake in time");
        if (now >= deadline) {
            char missing[200] = "";
            size_t len = 0;
            for (int j = 0; j < world && len < sizeof missing - 16; j++)
                if (expect[j] && !links[j]) len += (size_t)snprintf(missing + len, sizeof missing - len, "%s%d", len ? ", " : "", j);
            st = ts_error(TS_ERR_TIMEOUT, "waiting for ranks %s to connect to this rank's listener %s timed out", missing,
                          A->where);
            break;
        }
        bool listening = paused_until <= now;
        pf[0] = (struct pollfd){listening ? listen_fd : -1, POLLIN, 0};
        for (int i = 0; i < A->np; i++) pf[1 + i] = (struct pollfd){A->p[i].fd, POLLIN, 0};
        double until = deadline;
        if (A->np) until = TS_MIN(until, A->p[0].deadline);
        if (!listening) until = TS_MIN(until, paused_until);
        int pr = poll(pf, (nfds_t)(1 + A->np), ms_until(until));
        if (pr <= 0) continue;
        /* Answers first (from the newest, so removals keep the indices below valid). */
        for (int i = A->np - 1; i >= 0; i--) {
            if (!(pf[1 + i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
            int r = pend_read(A, i, expect, links);
            if (r < 0) {
                st = (ts_status)r;
                goto done;
            }
            want -= r;
        }
        if (listening && (pf[0].revents & POLLIN)) paused_until = accept_some(A);
    }
done:
    for (int i = 0; i < A->np; i++) close(A->p[i].fd);
    free(A);
    return st;
}
