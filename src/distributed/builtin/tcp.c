/*
 * distributed/builtin/tcp.c — the TCP transport: one socket per pair of ranks
 * (the higher rank connects to the lower one's listening socket and sends a
 * 12-byte introduction), TCP_NODELAY, non-blocking; the algorithms poll()
 * the sockets while they wait. A reducing receive reads into a 256 KiB
 * staging buffer and combines whole f32 elements into the destination,
 * carrying a partial element to the next call. EOF, ECONNRESET or EPIPE is
 * TS_ERR_REMOTE naming the peer rank.
 */
#include "distributed/builtin/transport.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define TCP_MAGIC 0x74737463u /* "tstc" */
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
    /* n is a multiple of 4 and the partial bytes belong to this message. */
    size_t want = TS_MIN(n, (size_t)STAGE_BYTES) - k->partial;
    long r = recv_raw(l, k->stage + k->partial, want);
    if (r <= 0) return r;
    size_t have = k->partial + (size_t)r, whole = have & ~(size_t)3;
    ts__reduce_f32(dst, k->stage, whole / 4, op, scale);
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

ts_status ts__tcp_listen(int *fd_out, char *addr, size_t addr_len) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return ts_error(TS_ERR_IO, "socket: %s", strerror(errno));
    struct sockaddr_in sa = {0};
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_ANY);
    socklen_t sl = sizeof sa;
    if (bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0 || listen(fd, 256) != 0 ||
        getsockname(fd, (struct sockaddr *)&sa, &sl) != 0) {
        ts_status st = ts_error(TS_ERR_IO, "listening socket for the process group: %s", strerror(errno));
        close(fd);
        return st;
    }
    /* The address peers should use: TS_DIST_IFADDR, else the interface that
     * routes to MASTER_ADDR, else 127.0.0.1. */
    char ip[64] = "127.0.0.1";
    const char *ifaddr = getenv("TS_DIST_IFADDR"), *master = getenv("MASTER_ADDR");
    if (ifaddr && *ifaddr) {
        snprintf(ip, sizeof ip, "%s", ifaddr);
    } else if (master && *master) {
        struct addrinfo hints = {0}, *res = NULL;
        hints.ai_family = AF_INET;
        hints.ai_socktype = SOCK_DGRAM;
        if (getaddrinfo(master, "9", &hints, &res) == 0 && res) {
            int u = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
            struct sockaddr_in me = {0};
            socklen_t ml = sizeof me;
            if (u >= 0 && connect(u, res->ai_addr, res->ai_addrlen) == 0 &&
                getsockname(u, (struct sockaddr *)&me, &ml) == 0)
                inet_ntop(AF_INET, &me.sin_addr, ip, sizeof ip);
            if (u >= 0) close(u);
            freeaddrinfo(res);
        }
    }
    snprintf(addr, addr_len, "%s:%d", ip, (int)ntohs(sa.sin_port));
    *fd_out = fd;
    return TS_OK;
}

/* Blocking-style full write/read on a non-blocking socket, bounded by deadline. */
static ts_status io_full(int fd, void *buf, size_t n, bool wr, double deadline, int peer) {
    size_t done = 0;
    while (done < n) {
        ssize_t r = wr ? send(fd, (char *)buf + done, n - done, MSG_DONTWAIT | MSG_NOSIGNAL)
                       : recv(fd, (char *)buf + done, n - done, MSG_DONTWAIT);
        if (r > 0) {
            done += (size_t)r;
            continue;
        }
        if (r == 0) return remote_err(peer, 0);
        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return remote_err(peer, errno);
        if (now_s() >= deadline)
            return ts_error(TS_ERR_TIMEOUT, "connecting to rank %d: no answer in time", peer);
        struct pollfd p = {fd, wr ? POLLOUT : POLLIN, 0};
        poll(&p, 1, ms_until(deadline));
    }
    return TS_OK;
}

ts_status ts__tcp_connect(const char *addr, int rank, int peer, double deadline, ts__link **out) {
    char host[256];
    snprintf(host, sizeof host, "%s", addr);
    char *colon = strrchr(host, ':');
    if (!colon) return ts_error(TS_ERR_FORMAT, "rank %d published a bad address '%s'", peer, addr);
    *colon = 0;
    struct addrinfo hints = {0}, *res = NULL;
    hints.ai_family = AF_INET;
    hints.ai_socktype = SOCK_STREAM;
    int gai = getaddrinfo(host, colon + 1, &hints, &res);
    if (gai != 0 || !res) return ts_error(TS_ERR_IO, "rank %d's address %s: %s", peer, addr, gai_strerror(gai));
    int fd = -1;
    ts_status st = TS_OK;
    for (;;) {
        fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (fd < 0) {
            st = ts_error(TS_ERR_IO, "socket: %s", strerror(errno));
            break;
        }
        int r = connect(fd, res->ai_addr, res->ai_addrlen);
        int err = r == 0 ? 0 : errno;
        if (err == EINPROGRESS) {
            struct pollfd p = {fd, POLLOUT, 0};
            while (poll(&p, 1, ms_until(deadline)) == 0 && now_s() < deadline) {
            }
            socklen_t el = sizeof err;
            if (!(p.revents & (POLLOUT | POLLERR | POLLHUP))) err = ETIMEDOUT;
            else if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el) != 0) err = errno;
        }
        if (err == 0) break;
        close(fd);
        fd = -1;
        if (now_s() >= deadline || (err != ECONNREFUSED && err != ETIMEDOUT)) {
            st = ts_error(err == ETIMEDOUT ? TS_ERR_TIMEOUT : TS_ERR_REMOTE, "connecting to rank %d at %s: %s", peer,
                          addr, strerror(err));
            break;
        }
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    freeaddrinfo(res);
    if (st != TS_OK) return st;
    uint32_t hello[3] = {TCP_MAGIC, (uint32_t)rank, 0};
    st = io_full(fd, hello, sizeof hello, true, deadline, peer);
    if (st != TS_OK) {
        close(fd);
        return st;
    }
    return make_link(fd, peer, out);
}

ts_status ts__tcp_accept(int listen_fd, int world, double deadline, ts__link **out) {
    for (;;) {
        struct pollfd p = {listen_fd, POLLIN, 0};
        int pr = poll(&p, 1, ms_until(deadline));
        if (pr <= 0) {
            if (now_s() >= deadline)
                return ts_error(TS_ERR_TIMEOUT, "waiting for peers to connect to the process group timed out");
            continue;
        }
        int fd = accept4(listen_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd < 0) {
            if (errno == EINTR || errno == EAGAIN || errno == ECONNABORTED) continue;
            return ts_error(TS_ERR_IO, "accept: %s", strerror(errno));
        }
        uint32_t hello[3];
        ts_status st = io_full(fd, hello, sizeof hello, false, deadline, -1);
        if (st != TS_OK || hello[0] != TCP_MAGIC || hello[1] >= (uint32_t)world) {
            close(fd); /* a stray connection: ignore it */
            if (now_s() >= deadline) return st != TS_OK ? st : ts_error(TS_ERR_TIMEOUT, "accepting peers timed out");
            continue;
        }
        return make_link(fd, (int)hello[1], out);
    }
}
