/*
 * distributed/sock.h — the one copy of the client-side socket plumbing of src/distributed
 * (internal): blocking-style I/O with deadlines over non-blocking sockets, a bounded
 * connect, the first connection to host:port with retries and a protocol's handshake,
 * a pool of idle connections and a growable byte buffer (byte order: core/bytes.h).
 *
 * Used by the two store clients (store_tcp.c: Tessera's own protocol, big-endian frames;
 * store_torch.c: PyTorch's TCPStore, little-endian, no framing) and the built-in backend's
 * link handshakes (builtin/tcp.c). Nothing here knows a protocol: the caller says what a
 * handshake is and formats its own messages from the ts__io results.
 *
 * Deadlines are absolute ts_time_now() seconds. Sockets are non-blocking (SOCK_NONBLOCK);
 * every wait goes through poll() with the time left. Any thread; no globals.
 */
#ifndef TS_DIST_SOCK_H
#define TS_DIST_SOCK_H

#include "core/bytes.h"
#include "core/internal.h"

#include <pthread.h>
#include <sys/socket.h>

/* What one send/receive/wait came to. TS__IO_ERR leaves errno set. */
typedef enum ts__io {
    TS__IO_OK = 0,
    TS__IO_TIMEOUT, /* the deadline passed first */
    TS__IO_CLOSED,  /* the peer closed the connection (EOF, ECONNRESET, EPIPE) */
    TS__IO_ERR,     /* another socket error (errno) */
} ts__io;

/* Waits until fd is ready for events (POLLIN / POLLOUT) or has an error the next call reports. */
ts__io ts__sock_wait(int fd, short events, double deadline);
/* Sends / receives exactly n bytes. */
ts__io ts__sock_send(int fd, const void *p, size_t n, double deadline);
ts__io ts__sock_recv(int fd, void *p, size_t n, double deadline);

/* One non-blocking TCP connect to sa bounded by deadline, TCP_NODELAY set: the fd, or -1 with
 * *err (an errno value; ETIMEDOUT when the deadline passed). */
int ts__sock_connect(const struct sockaddr *sa, socklen_t salen, double deadline, int *err);

/* A protocol's handshake on a fresh connection. TS_OK: the connection is the caller's.
 * An error with *retry false is final (refused, not that protocol); with *retry true the
 * server is there but dropped us (at its connection limit): why[] says so and the dial
 * backs off and tries again. */
typedef ts_status (*ts__sock_hello)(void *ctx, int fd, double deadline, bool *retry, char *why, size_t wn);

/* The first connection to host:port: every address getaddrinfo gives (IPv4 and IPv6),
 * connect, then hello (NULL: none). Unreachable or refused addresses, and handshakes that
 * ask for a retry, are tried again with backoff (10 ms doubling to 1 s) for timeout_s.
 * TS_OK with *fd and the address that answered; hello's final error as it is; else
 * TS_ERR_TIMEOUT: "<what>: cannot connect to host:port: nothing answered within T s (last
 * error: ...)" ("Connection refused" is kept over a later timeout). */
ts_status ts__sock_dial(const char *what, const char *host, int port, double timeout_s, ts__sock_hello hello,
                        void *ctx, int *fd, struct sockaddr_storage *addr, socklen_t *addrlen);

/* "host:port", or "[v6addr]:port" when host has a colon. */
void ts__sock_hostport(char *buf, size_t n, const char *host, int port);

/* Idle connections to one server, kept between calls (threads sharing a store each take
 * their own, so none waits behind another's parked request). */
typedef struct ts__sock_pool {
    pthread_mutex_t mu;
    int *fd;
    int n, cap;
} ts__sock_pool;

void ts__sock_pool_init(ts__sock_pool *p);
/* Closes every idle connection and frees the pool. */
void ts__sock_pool_destroy(ts__sock_pool *p);
/* Keeps fd for later (closes it when out of memory). */
void ts__sock_pool_put(ts__sock_pool *p, int fd);
/* An idle connection, or -1 when there is none. */
int ts__sock_pool_take(ts__sock_pool *p);

/* A growable byte buffer; oom is sticky (later puts do nothing), so a request is built
 * without checks and checked once. Zero-initialise; free(b.p) when done. */
typedef struct ts__wbuf {
    uint8_t *p;
    size_t n, cap;
    bool oom;
} ts__wbuf;

void ts__wbuf_put(ts__wbuf *b, const void *d, size_t n);
/* Room for a total of n bytes (exactly n when it grows); false when out of memory. */
bool ts__wbuf_reserve(ts__wbuf *b, size_t n);
void ts__wbuf_be(ts__wbuf *b, uint64_t v, int nbytes); /* an n-byte big-endian integer */
void ts__wbuf_le(ts__wbuf *b, uint64_t v, int nbytes); /* an n-byte little-endian integer */

#endif /* TS_DIST_SOCK_H */
