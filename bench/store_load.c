/*
 * bench/store_load.c — a rendezvous store under load: many clients, each on its
 * own connection, doing what thousands of ranks' rendezvous and elastic agents
 * do (set, get, add, check) against one server, and a rendezvous of R ranks.
 * bench/store_load.sh runs it against Tessera's TCP store, PyTorch's TCPStore
 * (driven by the same C clients, speaking torch's protocol) and a bare echo
 * server over the same loopback (the limit: one request, one reply, no work).
 *
 *   bench_store_load --serve FILE                  a Tessera store server; its port into FILE
 *   bench_store_load --echo FILE                   an echo server (same single-thread poll loop shape)
 *   bench_store_load --target tessera|torch|echo --port P [--clients C] [--seconds S] [--value-bytes B]
 *       C threads, each its own connection, loop over: set k, get k, add counter, check k (k private to
 *       the thread, a value of B bytes, default 64): ops/s over all, and per-op latency p50 / p99.
 *       Tessera's server and clients take the job token from TS_JOB_TOKEN, as a job's ranks do. The clients
 *       connect at once and do one untimed set each; the clock starts when all have (connect_all_s: how long
 *       that took, connect_max_s: the slowest client's).
 *   bench_store_load --rdzv R --port P [--rounds N]
 *       R threads, each connecting to the Tessera server at P (with the job token of TS_JOB_TOKEN, if set)
 *       and joining a group of R ranks as ts_pg_new does (the same join code): the time from the first
 *       connect to the last rank's return, best of N rounds.
 *
 * Servers stop when their stdin closes. Output: one line per run, "key value" pairs, for the script.
 */
#include "tessera.h"
#include "distributed/rendezvous.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define ECHO_MSG 32 /* bytes per echo request and reply: about a store GET of a short key */

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void raise_nofile(void) {
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
}

static int write_port(const char *file, int port) {
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", file);
    FILE *f = fopen(tmp, "w");
    if (!f || fprintf(f, "%d\n", port) < 0 || fclose(f) != 0 || rename(tmp, file) != 0) {
        fprintf(stderr, "store_load: cannot write %s: %s\n", file, strerror(errno));
        return 1;
    }
    return 0;
}

static void wait_stdin_closed(void) {
    char b[256];
    while (read(0, b, sizeof b) > 0) {
    }
}

/* ---- servers ------------------------------------------------------------------------------------------ */
static int serve_tessera(const char *file) {
    ts_store_tcp_options o = TS_STORE_TCP_OPTIONS_INIT;
    ts_store *s = NULL;
    if (ts_store_tcp_new_ex("127.0.0.1", 0, true, 600, &o, &s) != TS_OK) {
        fprintf(stderr, "store_load: server: %s\n", ts_last_error());
        return 1;
    }
    if (write_port(file, ts_store_tcp_port(s))) return 1;
    wait_stdin_closed();
    ts_store_release(s);
    return 0;
}

/* One thread, poll() over every connection: read ECHO_MSG bytes, write them back. */
static int serve_echo(const char *file) {
    int lfd = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t al = sizeof a;
    setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (lfd < 0 || bind(lfd, (struct sockaddr *)&a, sizeof a) != 0 || listen(lfd, 4096) != 0 ||
        getsockname(lfd, (struct sockaddr *)&a, &al) != 0) {
        fprintf(stderr, "store_load: echo server: %s\n", strerror(errno));
        return 1;
    }
    if (write_port(file, ntohs(a.sin_port))) return 1;
    int cap = 65536, n = 2;
    struct pollfd *pf = calloc((size_t)cap, sizeof *pf);
    pf[0] = (struct pollfd){0, POLLIN, 0};
    pf[1] = (struct pollfd){lfd, POLLIN, 0};
    for (;;) {
        if (poll(pf, (nfds_t)n, -1) < 0 && errno != EINTR) break;
        if (pf[0].revents) break; /* stdin closed */
        if (pf[1].revents & POLLIN) {
            int fd = accept(lfd, NULL, NULL);
            if (fd >= 0 && n < cap) {
                setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
                pf[n++] = (struct pollfd){fd, POLLIN, 0};
            } else if (fd >= 0) close(fd);
        }
        for (int i = 2; i < n; i++) {
            if (!pf[i].revents) continue;
            char b[ECHO_MSG * 8];
            ssize_t r = read(pf[i].fd, b, sizeof b);
            if (r <= 0 || write(pf[i].fd, b, (size_t)r) != r) {
                close(pf[i].fd);
                pf[i--] = pf[--n];
            }
        }
    }
    free(pf);
    close(lfd);
    return 0;
}

/* ---- load clients ------------------------------------------------------------------------------------- */
typedef enum { TARGET_TESSERA, TARGET_TORCH, TARGET_ECHO } target;

typedef struct client {
    target tg;
    int port, id;
    size_t value_bytes;
    double seconds;
    pthread_barrier_t *ready; /* every client connected and warmed up */
    const double *start;      /* then all start at *start, set by the main thread */
    double *lat;         /* per-op latencies (s) */
    size_t nlat, cap;
    double ready_s; /* from the thread's start to its first op's end: connecting */
    int failed;
} client;

static int echo_connect(int port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        if (fd >= 0) close(fd);
        return -1;
    }
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return fd;
}

static int echo_op(int fd) {
    char b[ECHO_MSG] = {1};
    if (write(fd, b, sizeof b) != (ssize_t)sizeof b) return 1;
    size_t got = 0;
    while (got < sizeof b) {
        ssize_t r = read(fd, b + got, sizeof b - got);
        if (r <= 0) return 1;
        got += (size_t)r;
    }
    return 0;
}

/* One store operation of the cycle set, get, add, check: 0 on success. */
static int store_op(ts_store *s, int k, const char *key, const char *value, size_t vlen) {
    switch (k & 3) {
    case 0: return ts_store_set(s, key, value, vlen) != TS_OK;
    case 1: {
        void *v = NULL;
        size_t n = 0;
        int rc = ts_store_get(s, key, &v, &n) != TS_OK || n != vlen;
        free(v);
        return rc;
    }
    case 2: {
        int64_t r = 0;
        return ts_store_add(s, "counter", 1, &r) != TS_OK;
    }
    default: {
        bool e = false;
        return ts_store_check(s, key, &e) != TS_OK || !e;
    }
    }
}

static void *client_main(void *arg) {
    client *c = arg;
    ts_store *s = NULL;
    int fd = -1;
    double t_begin = now_s();
    if (c->tg == TARGET_ECHO) fd = echo_connect(c->port);
    else if (c->tg == TARGET_TORCH) (void)ts_store_torch_new("127.0.0.1", c->port, 60, &s);
    else {
        (void)ts_store_tcp_new("127.0.0.1", c->port, false, 60, &s); /* TS_JOB_TOKEN's token, as a rank's */
    }
    if (fd < 0 && !s) {
        fprintf(stderr, "store_load: client %d cannot connect: %s\n", c->id, c->tg == TARGET_ECHO ? strerror(errno) : ts_last_error());
        c->failed = 1;
        pthread_barrier_wait(c->ready);
        pthread_barrier_wait(c->ready);
        return NULL;
    }
    char key[64], *value = malloc(c->value_bytes + 1);
    snprintf(key, sizeof key, "load/%d", c->id);
    memset(value, 'v', c->value_bytes);
    /* one untimed set first: a client pool that connects on first use does so before the clock starts (64
     * connects at once overflow a small listen backlog: SYN retries of 1 s and more, not the store's speed) */
    if (fd >= 0 ? echo_op(fd) : store_op(s, 0, key, value, c->value_bytes)) {
        fprintf(stderr, "store_load: client %d: the first op failed: %s\n", c->id, fd >= 0 ? "echo" : ts_last_error());
        c->failed = 1;
    }
    c->ready_s = now_s() - t_begin;
    pthread_barrier_wait(c->ready);
    pthread_barrier_wait(c->ready); /* the main thread set *start between the two */
    double end = *c->start + c->seconds;
    for (int k = 0; !c->failed; k++) {
        double t0 = now_s();
        if (t0 >= end) break;
        int bad = fd >= 0 ? echo_op(fd) : store_op(s, k, key, value, c->value_bytes);
        if (bad) {
            fprintf(stderr, "store_load: client %d: op %d failed: %s\n", c->id, k & 3, fd >= 0 ? "echo" : ts_last_error());
            c->failed = 1;
            break;
        }
        if (c->nlat == c->cap) {
            c->cap = c->cap ? 2 * c->cap : 4096;
            c->lat = realloc(c->lat, c->cap * sizeof *c->lat);
        }
        c->lat[c->nlat++] = now_s() - t0;
    }
    free(value);
    if (fd >= 0) close(fd);
    ts_store_release(s);
    return NULL;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static int run_load(target tg, int port, int nclients, double seconds, size_t value_bytes) {
    client *cs = calloc((size_t)nclients, sizeof *cs);
    pthread_t *th = calloc((size_t)nclients, sizeof *th);
    pthread_attr_t at;
    pthread_attr_init(&at);
    pthread_attr_setstacksize(&at, 256 << 10);
    double start = 0;
    pthread_barrier_t ready;
    pthread_barrier_init(&ready, NULL, (unsigned)nclients + 1);
    double t_connect = now_s();
    for (int i = 0; i < nclients; i++) {
        cs[i] = (client){tg, port, i, value_bytes, seconds, &ready, &start, NULL, 0, 0, 0, 0};
        if (pthread_create(&th[i], &at, client_main, &cs[i]) != 0) {
            fprintf(stderr, "store_load: cannot start client thread %d\n", i);
            exit(1);
        }
    }
    pthread_barrier_wait(&ready);
    double connect_all = now_s() - t_connect;
    start = now_s();
    pthread_barrier_wait(&ready);
    size_t total = 0;
    int failed = 0;
    double ready_max = 0;
    for (int i = 0; i < nclients; i++) {
        pthread_join(th[i], NULL);
        total += cs[i].nlat;
        failed += cs[i].failed;
        if (cs[i].ready_s > ready_max) ready_max = cs[i].ready_s;
    }
    pthread_barrier_destroy(&ready);
    double *all = malloc((total ? total : 1) * sizeof *all);
    size_t k = 0;
    for (int i = 0; i < nclients; i++) {
        memcpy(all + k, cs[i].lat, cs[i].nlat * sizeof *all);
        k += cs[i].nlat;
        free(cs[i].lat);
    }
    qsort(all, total, sizeof *all, cmp_double);
    static const char *names[] = {"tessera", "torch", "echo"};
    printf("target %s clients %d ops %zu ops_per_s %.0f p50_us %.1f p99_us %.1f connect_all_s %.3f "
           "connect_max_s %.3f failed %d\n", names[tg], nclients, total, (double)total / seconds,
           total ? 1e6 * all[total / 2] : 0, total ? 1e6 * all[total * 99 / 100] : 0, connect_all, ready_max, failed);
    free(all);
    free(cs);
    free(th);
    pthread_attr_destroy(&at);
    return failed ? 1 : 0;
}

/* ---- a rendezvous of R threads ------------------------------------------------------------------------ */
typedef struct rdzv_rank {
    int port, rank, world, round;
    int failed;
} rdzv_rank;

static void *rdzv_main(void *arg) {
    rdzv_rank *r = arg;
    ts_store *s = NULL, *joined = NULL;
    if (ts_store_tcp_new("127.0.0.1", r->port, false, 120, &s) != TS_OK) goto fail;
    char group[32];
    snprintf(group, sizeof group, "round%d", r->round);
    ts_pg_options o = TS_PG_OPTIONS_INIT;
    o.store = s;
    o.rank = r->rank;
    o.world_size = r->world;
    o.local_rank = r->rank; /* one host: as a launcher that says LOCAL_RANK / LOCAL_WORLD_SIZE */
    o.local_world_size = r->world;
    o.group_name = group;
    o.timeout_s = 120;
    int rank, world, lr, lw;
    double to;
    if (ts__rendezvous(&o, &joined, &rank, &world, &lr, &lw, &to) != TS_OK) goto fail;
    ts_store_release(joined);
    ts_store_release(s);
    return NULL;
fail:
    fprintf(stderr, "store_load: rank %d of %d: %s\n", r->rank, r->world, ts_last_error());
    r->failed = 1;
    ts_store_release(s);
    return NULL;
}

static int run_rdzv(int port, int world, int rounds) {
    rdzv_rank *rs = calloc((size_t)world, sizeof *rs);
    pthread_t *th = calloc((size_t)world, sizeof *th);
    pthread_attr_t at;
    pthread_attr_init(&at);
    pthread_attr_setstacksize(&at, 256 << 10);
    double best = 1e30;
    int failed = 0;
    for (int round = 0; round < rounds && !failed; round++) {
        double t0 = now_s();
        for (int i = 0; i < world; i++) {
            rs[i] = (rdzv_rank){port, i, world, round, 0};
            if (pthread_create(&th[i], &at, rdzv_main, &rs[i]) != 0) {
                fprintf(stderr, "store_load: cannot start thread %d\n", i);
                world = i;
                failed = 1;
                break;
            }
        }
        for (int i = 0; i < world; i++) {
            pthread_join(th[i], NULL);
            failed += rs[i].failed;
        }
        double dt = now_s() - t0;
        if (dt < best) best = dt;
    }
    printf("rendezvous ranks %d best_s %.3f rounds %d failed %d\n", world, best, rounds, failed);
    free(rs);
    free(th);
    pthread_attr_destroy(&at);
    return failed ? 1 : 0;
}

int main(int argc, char **argv) {
    const char *serve = NULL, *echo = NULL, *tname = NULL;
    int port = 0, clients = 64, rdzv = 0, rounds = 3;
    double seconds = 3;
    long value_bytes = 64;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) {
            fprintf(stderr, "store_load: %s needs a value (see the comment at the top of bench/store_load.c)\n", a);
            return 2;
        }
        i++;
        if (!strcmp(a, "--serve")) serve = v;
        else if (!strcmp(a, "--echo")) echo = v;
        else if (!strcmp(a, "--target")) tname = v;
        else if (!strcmp(a, "--port")) port = atoi(v);
        else if (!strcmp(a, "--clients")) clients = atoi(v);
        else if (!strcmp(a, "--seconds")) seconds = atof(v);
        else if (!strcmp(a, "--value-bytes")) value_bytes = atol(v);
        else if (!strcmp(a, "--rdzv")) rdzv = atoi(v);
        else if (!strcmp(a, "--rounds")) rounds = atoi(v);
        else {
            fprintf(stderr, "store_load: unknown flag %s\n", a);
            return 2;
        }
    }
    raise_nofile();
    ts_log_set_level(TS_LOG_ERROR);
    if (serve) return serve_tessera(serve);
    if (echo) return serve_echo(echo);
    if (port <= 0 || port > 65535 || clients < 1 || clients > 60000 || seconds <= 0 || value_bytes < 1 ||
        value_bytes > (64 << 20) || rounds < 1) {
        fprintf(stderr, "store_load: bad --port, --clients, --seconds, --value-bytes or --rounds\n");
        return 2;
    }
    if (rdzv > 0) return run_rdzv(port, rdzv, rounds);
    target tg = !tname ? TARGET_TESSERA : !strcmp(tname, "torch") ? TARGET_TORCH : !strcmp(tname, "echo") ? TARGET_ECHO : TARGET_TESSERA;
    if (tname && tg == TARGET_TESSERA && strcmp(tname, "tessera")) {
        fprintf(stderr, "store_load: --target %s: expected tessera, torch or echo\n", tname);
        return 2;
    }
    return run_load(tg, port, clients, seconds, (size_t)value_bytes);
}
