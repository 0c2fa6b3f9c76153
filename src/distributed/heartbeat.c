/*
 * distributed/heartbeat.c — heartbeats between the ranks of a process group, on
 * a thread of their own, so that a peer that is stopped (SIGSTOP, a debugger,
 * a frozen host) is named within seconds instead of at the collective timeout.
 *
 * ---- Why a side channel ------------------------------------------------------------------------
 * A stopped process sends nothing, and a busy one (a long evaluation between
 * collectives) sends nothing on its collective links either; only a thread
 * that never waits for the training thread can tell the two apart. Each group
 * has one such thread per rank. Its traffic does not touch the backend's links
 * (shared memory rings, TCP streams, MPI), so it works under every backend and
 * while a collective holds the links.
 *
 * ---- Setup ----------------------------------------------------------------------------------------
 * Through the group's prefix store, before the backend connects:
 *   gen = add("hb/join/<rank>", 1)       (successive groups of one name on one store)
 *   set("hb/<gen>/<rank>", "<ip> <port> <pid> <nonce> <host>")
 *   get("hb/<gen>/<peer>") for every peer
 * Without a shared store (the mpi backend under plain mpirun) pg.c exchanges
 * the same strings with the backend's all_gather once it is connected
 * (ts__heartbeat_peers_from_table); a rank whose entry is empty (it could not
 * set up heartbeats) is never judged.
 * The socket is UDP, bound to every interface on a free port; the address
 * published is the job's interface (distributed/netaddr.h: TS_SOCKET_IFNAME,
 * TS_DIST_IFADDR, the route to MASTER_ADDR, 127.0.0.1: the TCP transport's choice). The nonce is random
 * per rank and group: a datagram is accepted only from a (rank, nonce) that
 * was published, so strays and older groups are ignored.
 *
 * ---- Datagrams (48 bytes, big-endian) ----------------------------------------------------------
 *   u32 magic "TSHB" | u32 kind (1 beat, 2 bye) | u32 rank | u32 0 | u64 nonce | u64 count
 *   | u64 last collective started | u64 last collective completed
 * The first beat leaves from ts__heartbeat_run itself (so a process stopped
 * before its thread first runs has still been heard once); then, every
 * interval (TS_HEARTBEAT_INTERVAL seconds; default timeout / 10, between 0.05
 * and 1 s), the thread sends a beat to every peer, reads what arrived and
 * notes, per peer, when it last heard from it and its position. A position is
 * up to one interval old: it says where the peer was, not where it stopped.
 * ts__heartbeat_stop sends "bye" twice: a peer that left is never waited for.
 *
 * ---- Judging a peer ------------------------------------------------------------------------------
 * After every round the thread asks the flight recorder what this rank is
 * waiting in. Nothing: no judgement (a peer may be stopped in a debugger while
 * this rank computes). A collective: every peer counts; send/recv: its peer.
 * A counted peer last heard from more than `timeout` ago fails the group once
 * (fail callback: TS_ERR_TIMEOUT, "rank R (host H, pid P) has not been heard
 * from for N s (stopped or hung?) while this rank (Q) was waiting in ...").
 * pg.c also asks (ts__heartbeat_suspect) when a collective failed because a
 * peer went away: over TCP a rank that gave up on a silent third rank only
 * closes its connections, and the silent one is the news.
 * Safeguards against blaming the innocent:
 *   - a peer is judged only after its first beat arrived (a network that
 *     drops UDP between two hosts turns their checks off, with one warning,
 *     instead of failing every collective);
 *   - when this thread itself did not run for max(3 intervals, timeout / 2)
 *     (this process was stopped or starved), every peer's silence restarts:
 *     the beats that did not arrive meanwhile are ours to miss.
 */
#include "distributed/heartbeat.h"

#include "core/bytes.h"
#include "core/env.h"
#include "distributed/netaddr.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define HB_MAGIC 0x54534842u /* "TSHB" */
#define HB_BEAT 1u
#define HB_BYE 2u
#define HB_BYTES 48
#define HB_PROBE_S 2.0 /* how long a silent peer's host has to answer a connection attempt */

typedef struct hb_peer {
    struct sockaddr_in addr;
    uint64_t nonce;
    int pid;
    char host[64];
    double last_heard; /* ts_time_now() of its last datagram */
    bool heard, left, warned;
    uint64_t started, completed; /* its position, from its last beat */
} hb_peer;

struct ts__heartbeat {
    int rank, world;
    double timeout_s, interval_s, t0;
    int fd, wake_r, wake_w;
    uint64_t nonce, count;
    ts__flight *fr;
    ts__hb_fail_fn fail;
    void *user;
    pthread_t thread;
    bool has_thread;
    atomic_bool stop, paused, fired;
    pthread_mutex_t mu; /* peers[] */
    hb_peer *peers;
    char address[TS__HB_ADDR_BYTES]; /* what peers need: "<ip> <port> <pid> <nonce> <host>" */
};

/* ---- configuration ------------------------------------------------------------------------------ */
/* TS_HEARTBEAT_TIMEOUT / _INTERVAL (core/env.c: 0 or off, or seconds in range; a bad value is an error) */
static ts_status env_seconds(ts_env_id id, double *out, bool *set) {
    TS_TRY(ts_env_check(id));
    *set = ts_env_is_set(id);
    if (*set) *out = ts_env_double(id);
    return TS_OK;
}

ts_status ts__heartbeat_interval(double timeout_s, double *out) {
    bool set = false;
    double iv = fmin(fmax(timeout_s / 10, 0.05), 1.0);
    TS_TRY(env_seconds(TS_ENV_HEARTBEAT_INTERVAL, &iv, &set));
    *out = fmax(iv, 0.01);
    return TS_OK;
}

ts_status ts__heartbeat_check_timeout(double timeout_s, const char *what) {
    if (!(timeout_s > 0)) return TS_OK; /* off */
    double iv = 0;
    TS_TRY(ts__heartbeat_interval(timeout_s, &iv));
    double min = TS__HB_MIN_INTERVALS * iv;
    if (timeout_s < min)
        return ts_error(TS_ERR_INVALID_ARG,
                        "%s is %g s, below the minimum of %g s (%d heartbeat intervals of %g s: a healthy rank "
                        "would be blamed for a beat that is merely late; 0 or off: no heartbeats)",
                        what, timeout_s, min, TS__HB_MIN_INTERVALS, iv);
    return TS_OK;
}

ts_status ts__heartbeat_resolve_timeout(double opt, double *out) {
    if (isnan(opt)) return ts_error(TS_ERR_INVALID_ARG, "ts_pg_options.heartbeat_timeout_s is NaN");
    if (opt != 0) {
        *out = opt > 0 ? opt : 0;
        return ts__heartbeat_check_timeout(*out, "ts_pg_options.heartbeat_timeout_s");
    }
    bool set = false;
    double v = TS_HEARTBEAT_DEFAULT_TIMEOUT_S;
    TS_TRY(env_seconds(TS_ENV_HEARTBEAT_TIMEOUT, &v, &set));
    char what[96];
    snprintf(what, sizeof what, "environment variable TS_HEARTBEAT_TIMEOUT=%g", v);
    TS_TRY(ts__heartbeat_check_timeout(v, what));
    *out = v;
    return TS_OK;
}

/* ---- wire --------------------------------------------------------------------------------------- */

static void send_all(ts__heartbeat *hb, uint32_t kind) {
    uint8_t m[HB_BYTES] = {0};
    ts__put_be(m, HB_MAGIC, 4);
    ts__put_be(m + 4, kind, 4);
    ts__put_be(m + 8, (uint64_t)hb->rank, 4);
    ts__put_be(m + 16, hb->nonce, 8);
    ts__put_be(m + 24, ++hb->count, 8);
    ts__put_be(m + 32, atomic_load_explicit(&hb->fr->coll_started, memory_order_relaxed), 8);
    ts__put_be(m + 40, atomic_load_explicit(&hb->fr->coll_completed, memory_order_relaxed), 8);
    for (int p = 0; p < hb->world; p++) {
        if (p == hb->rank) continue;
        /* peers[p].addr is written once before the thread starts: no lock needed */
        (void)sendto(hb->fd, m, sizeof m, MSG_DONTWAIT | MSG_NOSIGNAL, (const struct sockaddr *)&hb->peers[p].addr,
                     sizeof hb->peers[p].addr);
    }
}

static void receive_all(ts__heartbeat *hb) {
    uint8_t m[HB_BYTES + 16];
    for (;;) {
        ssize_t r = recv(hb->fd, m, sizeof m, MSG_DONTWAIT);
        if (r < 0) {
            if (errno == EINTR) continue;
            return; /* EAGAIN, or an error a datagram socket may report: nothing to read now */
        }
        if (r != HB_BYTES || ts__get_be(m, 4) != HB_MAGIC) continue;
        uint32_t kind = (uint32_t)ts__get_be(m + 4, 4);
        uint64_t peer = ts__get_be(m + 8, 4), nonce = ts__get_be(m + 16, 8);
        if (peer >= (uint64_t)hb->world || (int)peer == hb->rank) continue;
        pthread_mutex_lock(&hb->mu);
        hb_peer *p = &hb->peers[peer];
        if (p->nonce == nonce) {
            p->last_heard = ts_time_now();
            p->heard = true;
            if (kind == HB_BYE) p->left = true;
            p->started = ts__get_be(m + 32, 8);
            p->completed = ts__get_be(m + 40, 8);
        }
        pthread_mutex_unlock(&hb->mu);
    }
}

/* ---- judging ------------------------------------------------------------------------------------ */
/* The peer op waits on that has been silent longest, if over min_silence: its
 * rank with *b filled (b->op = op), else -1. Warns once about peers never heard. */
static int suspect(ts__heartbeat *hb, const ts_pg_op_record *op, double now, double min_silence, ts__hb_blame *b) {
    bool p2p = ts_coll_kind_is_p2p(op->kind);
    int worst = -1;
    double silent = 0;
    pthread_mutex_lock(&hb->mu);
    for (int p = 0; p < hb->world; p++) {
        hb_peer *q = &hb->peers[p];
        if (p == hb->rank || q->left || (p2p && p != op->peer)) continue;
        if (!q->heard) {
            if (!q->warned && now - hb->t0 > hb->timeout_s) {
                q->warned = true;
                ts_log(TS_LOG_WARN,
                       "rank %d: no heartbeat from rank %d (host %s, pid %d) in %.0f s since the group started: are "
                       "UDP datagrams to port %d blocked? Liveness checks of rank %d are off until one arrives",
                       hb->rank, p, q->host, q->pid, now - hb->t0, (int)ntohs(hb->peers[hb->rank].addr.sin_port), p);
            }
            continue;
        }
        if (now - q->last_heard > silent) {
            silent = now - q->last_heard;
            worst = p;
        }
    }
    if (worst < 0 || silent <= min_silence) {
        pthread_mutex_unlock(&hb->mu);
        return -1;
    }
    const hb_peer *q = &hb->peers[worst];
    memset(b, 0, sizeof *b);
    b->rank = worst;
    b->pid = q->pid;
    snprintf(b->host, sizeof b->host, "%s", q->host);
    b->silent_s = silent;
    b->started = q->started;
    b->completed = q->completed;
    b->op = *op;
    pthread_mutex_unlock(&hb->mu);
    return worst;
}

/* "; its last heartbeat (N s ago) said it had completed collective #S" for collectives, else "". */
static void position(const ts__hb_blame *b, char *pos, size_t n) {
    pos[0] = 0;
    if (ts_coll_kind_is_p2p(b->op.kind)) return;
    int k = snprintf(pos, n, "; its last heartbeat (%.1f s ago) said it ", b->silent_s);
    if (k < 0 || (size_t)k >= n) return;
    if (b->started >= b->op.seq)
        snprintf(pos + k, n - (size_t)k, "had started collective #%llu too", (unsigned long long)b->started);
    else if (b->started == 0)
        snprintf(pos + k, n - (size_t)k, "had not started any collective");
    else if (b->completed >= b->started)
        snprintf(pos + k, n - (size_t)k, "had completed collective #%llu", (unsigned long long)b->completed);
    else
        snprintf(pos + k, n - (size_t)k, "was in collective #%llu", (unsigned long long)b->started);
}

/* Whether a silent peer's host still answers: a TCP connection attempt to its heartbeat port
 * (nothing listens there over TCP, so a host that is up answers at once with a reset, or accepts).
 * A stopped or hung process leaves its kernel answering; a cut link or a host that is down does not. */
typedef enum { HOST_ANSWERS, HOST_SILENT, HOST_UNKNOWN } host_probe;

static host_probe probe_host(const struct sockaddr_in *udp_addr, double timeout_s) {
    struct sockaddr_in a = *udp_addr;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return HOST_UNKNOWN;
    host_probe r = HOST_UNKNOWN;
    if (connect(fd, (struct sockaddr *)&a, sizeof a) == 0) r = HOST_ANSWERS;
    else if (errno == ECONNREFUSED) r = HOST_ANSWERS;
    else if (errno == EHOSTUNREACH || errno == ENETUNREACH || errno == ETIMEDOUT) r = HOST_SILENT;
    else if (errno == EINPROGRESS) {
        struct pollfd pf = {fd, POLLOUT, 0};
        int n = poll(&pf, 1, (int)(timeout_s * 1000));
        int err = 0;
        socklen_t el = sizeof err;
        if (n == 0) r = HOST_SILENT;
        else if (n > 0 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el) == 0)
            r = err == 0 || err == ECONNREFUSED ? HOST_ANSWERS
                : err == EHOSTUNREACH || err == ENETUNREACH || err == ETIMEDOUT ? HOST_SILENT : HOST_UNKNOWN;
    }
    close(fd);
    return r;
}

static void check(ts__heartbeat *hb, double now) {
    if (atomic_load(&hb->fired)) return;
    ts_pg_op_record op;
    ts__hb_blame b;
    if (!ts__flight_current(hb->fr, &op) || suspect(hb, &op, now, hb->timeout_s, &b) < 0) return;
    char what[200], pos[200], reason[900];
    ts__flight_describe(&op, what, sizeof what);
    position(&b, pos, sizeof pos);
    pthread_mutex_lock(&hb->mu);
    struct sockaddr_in at = hb->peers[b.rank].addr;
    pthread_mutex_unlock(&hb->mu);
    host_probe hp = probe_host(&at, HB_PROBE_S);
    const char *why = hp == HOST_ANSWERS ? "stopped or hung: its host answers"
                      : hp == HOST_SILENT ? "its host does not answer either: a network partition, or the host is down"
                                          : "stopped or hung?";
    snprintf(reason, sizeof reason,
             "rank %d (host %s, pid %d) has not been heard from for %.1f s (%s) while this rank (%d) "
             "was waiting in %s for %.1f s%s (heartbeat timeout %g s: TS_HEARTBEAT_TIMEOUT)",
             b.rank, b.host, b.pid, b.silent_s, why, hb->rank, what, op.started_s > 0 ? now - op.started_s : 0.0, pos,
             hb->timeout_s);
    atomic_store(&hb->fired, true);
    hb->fail(hb->user, TS_ERR_TIMEOUT, reason, &b);
}

int ts__heartbeat_suspect(ts__heartbeat *hb, const ts_pg_op_record *op, ts__hb_blame *b, char *note, size_t n) {
    if (!hb) return -1;
    double now = ts_time_now();
    int r = suspect(hb, op, now, fmax(2.5 * hb->interval_s, hb->timeout_s / 4), b);
    if (r < 0) return -1;
    char pos[200];
    position(b, pos, sizeof pos);
    snprintf(note, n, "; rank %d (host %s, pid %d) has not been heard from for %.1f s either (stopped or hung?)%s",
             b->rank, b->host, b->pid, b->silent_s, pos);
    return r;
}

static void *hb_main(void *arg) {
    ts__heartbeat *hb = arg;
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, NULL); /* signals are the application's business */
    double stall = fmax(3 * hb->interval_s, hb->timeout_s / 2), last = ts_time_now();
    double next_send = last + hb->interval_s; /* ts__heartbeat_start sent the first */
    while (!atomic_load(&hb->stop)) {
        double now = ts_time_now();
        if (now >= next_send) {
            if (!atomic_load(&hb->paused)) send_all(hb, HB_BEAT);
            next_send = now + hb->interval_s;
        }
        struct pollfd pf[2] = {{hb->fd, POLLIN, 0}, {hb->wake_r, POLLIN, 0}};
        int ms = (int)ceil((next_send - now) * 1000.0);
        poll(pf, 2, ms < 1 ? 1 : ms > 1000 ? 1000 : ms);
        if (pf[1].revents) {
            char b[16];
            while (read(hb->wake_r, b, sizeof b) > 0) {
            }
        }
        receive_all(hb);
        now = ts_time_now();
        if (now - last > stall) {
            ts_log(TS_LOG_WARN,
                   "rank %d: the heartbeat thread did not run for %.1f s (was this process stopped or starved?); "
                   "peers' silence is counted afresh",
                   hb->rank, now - last);
            pthread_mutex_lock(&hb->mu);
            for (int p = 0; p < hb->world; p++) hb->peers[p].last_heard = now;
            pthread_mutex_unlock(&hb->mu);
        }
        last = now;
        check(hb, now);
    }
    if (!atomic_load(&hb->paused)) {
        send_all(hb, HB_BYE);
        send_all(hb, HB_BYE);
    }
    return NULL;
}

/* ---- setup ------------------------------------------------------------------------------------------ */
/* The job's interface (distributed/netaddr.h, the TCP transport's choice), as a numeric IPv4 address;
 * 127.0.0.1 when that is IPv6 or cannot be had (heartbeats are IPv4). */
static void local_ip(char *ip, size_t n) {
    snprintf(ip, n, "127.0.0.1");
    struct sockaddr_storage ss;
    socklen_t sl = 0;
    const char *from = NULL;
    bool published_only = false;
    if (ts__net_local_addr(NULL, ts__net_job_spans_hosts(), &ss, &sl, &from, &published_only) != TS_OK) return; /* the transport reports it */
    if (ss.ss_family == AF_INET) inet_ntop(AF_INET, &((struct sockaddr_in *)&ss)->sin_addr, ip, (socklen_t)n);
}

static uint64_t random_nonce(int rank) {
    static _Atomic uint64_t counter;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t x = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 30) ^ ((uint64_t)getpid() << 17) ^ (uint64_t)rank;
    x += atomic_fetch_add(&counter, 1) * 0x9e3779b97f4a7c15ull;
    x ^= x >> 33; /* splitmix finaliser */
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return x ? x : 1;
}

static void hb_free(ts__heartbeat *hb) {
    if (hb->fd >= 0) close(hb->fd);
    if (hb->wake_r >= 0) close(hb->wake_r);
    if (hb->wake_w >= 0) close(hb->wake_w);
    pthread_mutex_destroy(&hb->mu);
    free(hb->peers);
    free(hb);
}

static ts_status parse_peer(const char *v, int peer, hb_peer *p) {
    char ip[64] = "", host[64] = "";
    int port = 0, pid = 0;
    unsigned long long nonce = 0;
    int k = sscanf(v, "%63s %d %d %llx %63s", ip, &port, &pid, &nonce, host);
    memset(&p->addr, 0, sizeof p->addr);
    p->addr.sin_family = AF_INET;
    p->addr.sin_port = htons((uint16_t)port);
    if (k != 5 || port <= 0 || port > 65535 || inet_pton(AF_INET, ip, &p->addr.sin_addr) != 1)
        return ts_error(TS_ERR_FORMAT, "heartbeat: rank %d published a bad address '%.100s'", peer, v);
    p->nonce = nonce;
    p->pid = pid;
    snprintf(p->host, sizeof p->host, "%s", host);
    return TS_OK;
}

ts_status ts__heartbeat_new(int rank, int world, double timeout_s, ts__flight *fr, ts__hb_fail_fn fail, void *user,
                            ts__heartbeat **out) {
    *out = NULL;
    ts__heartbeat *hb = ts__calloc(1, sizeof *hb);
    if (!hb) return TS_ERR_NOMEM;
    hb->fd = hb->wake_r = hb->wake_w = -1;
    pthread_mutex_init(&hb->mu, NULL);
    hb->rank = rank;
    hb->world = world;
    hb->timeout_s = timeout_s;
    hb->fr = fr;
    hb->fail = fail;
    hb->user = user;
    atomic_init(&hb->stop, false);
    atomic_init(&hb->paused, false);
    atomic_init(&hb->fired, false);
    ts_status st = TS_OK;
    TS_CHECK_GOTO(ts__heartbeat_interval(timeout_s, &hb->interval_s));
    hb->peers = ts__calloc((size_t)world, sizeof *hb->peers);
    if (!hb->peers) {
        st = TS_ERR_NOMEM;
        goto fail;
    }
    int wp[2];
    hb->fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (hb->fd < 0 || pipe2(wp, O_CLOEXEC | O_NONBLOCK) != 0) {
        st = ts_error(TS_ERR_IO, "heartbeat: socket: %s", strerror(errno));
        goto fail;
    }
    hb->wake_r = wp[0];
    hb->wake_w = wp[1];
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_ANY);
    socklen_t sl = sizeof sa;
    if (bind(hb->fd, (struct sockaddr *)&sa, sizeof sa) != 0 || getsockname(hb->fd, (struct sockaddr *)&sa, &sl) != 0) {
        st = ts_error(TS_ERR_IO, "heartbeat: binding a UDP socket: %s", strerror(errno));
        goto fail;
    }
    char ip[64], host[64] = "localhost";
    local_ip(ip, sizeof ip);
    gethostname(host, sizeof host - 1);
    for (char *c = host; *c; c++)
        if (*c == ' ') *c = '_';
    hb->nonce = random_nonce(rank);
    snprintf(hb->address, sizeof hb->address, "%s %d %d %llx %s", ip, (int)ntohs(sa.sin_port), (int)getpid(),
             (unsigned long long)hb->nonce, host);
    *out = hb;
    return TS_OK;
fail:
    hb_free(hb);
    return ts__error_prefix(st, "rank %d: setting up heartbeats", rank);
}

const char *ts__heartbeat_address(const ts__heartbeat *hb) { return hb->address; }

/* A peer's heartbeat address, waited for one interval at a time until deadline; in between, the
 * group's "failed" key (the rendezvous's verdict, e.g. a restarted rank that found its earlier self
 * in this round) ends the wait at once instead of at the store's timeout. */
static ts_status wait_peer_key(ts__heartbeat *hb, ts_store *store, const char *key, int peer, double deadline,
                               void **v, size_t *len) {
    double iv = fmax(hb->interval_s, 0.05);
    for (;;) {
        double left = deadline - ts_time_now();
        ts_status st = ts__store_get_timeout(store, key, fmax(fmin(iv * 5, left), 0.01), v, len);
        if (st != TS_ERR_TIMEOUT) return st;
        bool failed = false;
        if (store->vt->check(store, "failed", iv, &failed) == TS_OK && failed) {
            void *why = NULL;
            size_t wl = 0;
            st = ts__store_get_timeout(store, "failed", iv, &why, &wl);
            ts_status r = ts_error(TS_ERR_REMOTE, "rank %d: waiting for rank %d's heartbeat address: the round failed: %.*s",
                                   hb->rank, peer, st == TS_OK ? (int)wl : 1, st == TS_OK ? (const char *)why : "?");
            free(why);
            return r;
        }
        if (ts_time_now() >= deadline)
            return ts_error(TS_ERR_TIMEOUT, "rank %d: rank %d did not publish its heartbeat address within %g s "
                            "(stopped or gone after the rendezvous?)", hb->rank, peer, ts__store_timeout(store));
    }
}

ts_status ts__heartbeat_peers_from_store(ts__heartbeat *hb, ts_store *store) {
    char key[96];
    int64_t gen = 0;
    snprintf(key, sizeof key, "hb/join/%d", hb->rank);
    TS_TRY(ts_store_add(store, key, 1, &gen));
    snprintf(key, sizeof key, "hb/%lld/%d", (long long)gen, hb->rank);
    TS_TRY(ts_store_set(store, key, hb->address, strlen(hb->address)));
    double limit = ts__store_timeout(store), t0 = ts_time_now();
    for (int p = 0; p < hb->world; p++) {
        snprintf(key, sizeof key, "hb/%lld/%d", (long long)gen, p);
        void *v = NULL;
        size_t len = 0;
        TS_TRY(wait_peer_key(hb, store, key, p, t0 + limit, &v, &len));
        ts_status st = parse_peer(v, p, &hb->peers[p]);
        free(v);
        TS_TRY(st);
    }
    return TS_OK;
}

void ts__heartbeat_peers_from_table(ts__heartbeat *hb, const char *table) {
    for (int p = 0; p < hb->world; p++) {
        char v[TS__HB_ADDR_BYTES];
        memcpy(v, table + (size_t)p * TS__HB_ADDR_BYTES, sizeof v);
        v[sizeof v - 1] = 0;
        if (p != hb->rank && parse_peer(v, p, &hb->peers[p]) != TS_OK) {
            hb->peers[p].left = true; /* never judged */
            ts_log(TS_LOG_WARN, "rank %d: rank %d has no heartbeats (%s); a stop there ends at the collective timeout",
                   hb->rank, p, v[0] ? ts_last_error() : "it could not set them up");
        }
    }
}

ts_status ts__heartbeat_run(ts__heartbeat *hb) {
    hb->t0 = ts_time_now();
    for (int p = 0; p < hb->world; p++) hb->peers[p].last_heard = hb->t0;
    /* The first beat from this thread: every peer has bound its socket (it published after binding),
     * so each hears of us even if this process stops before the thread first runs. */
    send_all(hb, HB_BEAT);
    if (pthread_create(&hb->thread, NULL, hb_main, hb) != 0)
        return ts_error(TS_ERR_INTERNAL, "rank %d: cannot start the heartbeat thread", hb->rank);
    hb->has_thread = true;
    return TS_OK;
}

ts_status ts__heartbeat_start(ts_store *store, int rank, int world, double timeout_s, ts__flight *fr,
                              ts__hb_fail_fn fail, void *user, ts__heartbeat **out) {
    ts__heartbeat *hb = NULL;
    TS_TRY(ts__heartbeat_new(rank, world, timeout_s, fr, fail, user, &hb));
    ts_status st = ts__heartbeat_peers_from_store(hb, store);
    if (st == TS_OK) st = ts__heartbeat_run(hb);
    if (st != TS_OK) {
        hb_free(hb);
        return ts__error_prefix(st, "rank %d: setting up heartbeats", rank);
    }
    *out = hb;
    return TS_OK;
}

void ts__heartbeat_stop(ts__heartbeat *hb) {
    if (!hb) return;
    atomic_store(&hb->stop, true);
    ssize_t w = write(hb->wake_w, "x", 1);
    (void)w;
    if (hb->has_thread) pthread_join(hb->thread, NULL);
    hb_free(hb);
}

void ts__heartbeat_pause(ts__heartbeat *hb, bool paused) {
    if (hb) atomic_store(&hb->paused, paused);
}

int ts__heartbeat_behind(ts__heartbeat *hb, uint64_t seq, int *ranks, int cap) {
    int n = 0;
    if (!hb || seq == 0) return 0;
    pthread_mutex_lock(&hb->mu);
    for (int p = 0; p < hb->world && n < cap; p++)
        if (p != hb->rank && hb->peers[p].heard && !hb->peers[p].left && hb->peers[p].started < seq) ranks[n++] = p;
    pthread_mutex_unlock(&hb->mu);
    return n;
}
