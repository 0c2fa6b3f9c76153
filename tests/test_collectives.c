/*
 * tests/test_collectives.c — every collective of the built-in backend, for
 * world sizes 1..8 as threads in one process (memory store) and 2..4 as
 * forked processes (TCP store served by the test), over shared memory and
 * with TS_DIST_TRANSPORT=tcp; lengths 0, 1, 1009 and 2^20 + 3; exact values
 * (small integers in f32). Error cases: mismatched sizes, bad arguments,
 * timeouts, abort, and a rank killed with SIGKILL (never a hang).
 */
#include "test_util.h"

#include "core/internal.h"
#include "store_server.h"

#include <dirent.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/wait.h>
#include <unistd.h>

static atomic_int g_bad;
static atomic_int g_group;

#define RC(cond)                                                                                              \
    do {                                                                                                      \
        if (!(cond)) {                                                                                        \
            atomic_fetch_add(&g_bad, 1);                                                                      \
            fprintf(stderr, "%s:%d: rank %d/%d: CHECK failed: %s\n", __FILE__, __LINE__, rank, world, #cond); \
        }                                                                                                     \
    } while (0)
#define ROK(expr)                                                                                           \
    do {                                                                                                    \
        ts_status r_s = (expr);                                                                             \
        if (r_s != TS_OK) {                                                                                 \
            atomic_fetch_add(&g_bad, 1);                                                                    \
            fprintf(stderr, "%s:%d: rank %d/%d: %s -> %s: %s\n", __FILE__, __LINE__, rank, world, #expr,    \
                    ts_status_name(r_s), ts_last_error());                                                  \
        }                                                                                                   \
    } while (0)

typedef void (*body_fn)(ts_process_group *pg, int rank, int world, void *arg);

static ts_tensor *vec(int64_t n, ts_dtype dt) {
    ts_tensor *t = NULL;
    if (ts_tensor_empty(ts_device_cpu(), dt, 1, &n, &t) != TS_OK) {
        fprintf(stderr, "vec: %s\n", ts_last_error());
        abort();
    }
    return t;
}

/* Compares n floats with want(i); reports the first difference. */
#define CHECK_VALUES(ptr, n, expr_of_i, tol)                                                                   \
    do {                                                                                                       \
        const float *cv_p = (ptr);                                                                             \
        for (int64_t i = 0; i < (int64_t)(n); i++) {                                                           \
            double cv_w = (expr_of_i);                                                                         \
            if (!(fabs(cv_p[i] - cv_w) <= (tol))) {                                                            \
                atomic_fetch_add(&g_bad, 1);                                                                   \
                fprintf(stderr, "%s:%d: rank %d/%d: [%lld] = %g, expected %g\n", __FILE__, __LINE__, rank, world, \
                        (long long)i, (double)cv_p[i], cv_w);                                                  \
                break;                                                                                         \
            }                                                                                                  \
        }                                                                                                      \
    } while (0)

static ts_status make_pg(ts_store *store, int rank, int world, const char *group, double timeout,
                         ts_process_group **pg) {
    ts_pg_options o = TS_PG_OPTIONS_INIT;
    o.store = store;
    o.rank = rank;
    o.world_size = world;
    o.group_name = group;
    o.timeout_s = timeout;
    return ts_pg_new(&o, pg);
}

/* ---- ranks as threads ---------------------------------------------------------------------------------- */
typedef struct targ {
    ts_store *store;
    int rank, world;
    const char *group;
    double timeout;
    body_fn fn;
    void *arg;
} targ;

static void *thread_main(void *p) {
    targ *a = p;
    int rank = a->rank, world = a->world;
    ts_process_group *pg = NULL;
    ROK(make_pg(a->store, rank, world, a->group, a->timeout, &pg));
    if (pg) {
        RC(ts_pg_rank(pg) == rank && ts_pg_size(pg) == world);
        a->fn(pg, rank, world, a->arg);
        ts_pg_free(pg);
    }
    return NULL;
}

static void run_threads(int world, double timeout, body_fn fn, void *arg) {
    ts_store *store = NULL;
    CHECK_OK(ts_store_memory_new(&store));
    if (!store) return;
    char group[32];
    snprintf(group, sizeof group, "t%d", atomic_fetch_add(&g_group, 1));
    pthread_t th[16];
    targ args[16];
    for (int r = 0; r < world; r++) {
        args[r] = (targ){store, r, world, group, timeout, fn, arg};
        pthread_create(&th[r], NULL, thread_main, &args[r]);
    }
    for (int r = 0; r < world; r++) pthread_join(th[r], NULL);
    ts_store_release(store);
}

/* ---- ranks as processes ------------------------------------------------------------------------------------ */
/* A child process serves a TCP store on a free port (tests/store_server.h: the
 * test stays single-threaded while it forks); each other child is one rank.
 * Children exit with their failure count; `expect_killed` is a rank that
 * kills itself (-1: none). Returns after all children exited (killing
 * stragglers after 60 s). */
static void run_procs(int world, double timeout, bool tcp, int expect_killed, body_fn fn, void *arg) {
    tu_store_server server;
    if (!tu_store_server_start(&server)) return;
    int port = server.port;
    char group[32];
    snprintf(group, sizeof group, "p%d", atomic_fetch_add(&g_group, 1));
    if (tcp) setenv("TS_DIST_TRANSPORT", "tcp", 1);
    pid_t pids[16];
    fflush(NULL);
    for (int r = 0; r < world; r++) {
        pids[r] = fork();
        if (pids[r] == 0) {
            int rank = r;
            atomic_store(&g_bad, 0);
            ts_store *s = NULL;
            ts_process_group *pg = NULL;
            ROK(ts_store_tcp_new("127.0.0.1", port, false, 30.0, &s));
            if (s) ROK(make_pg(s, rank, world, group, timeout, &pg));
            if (pg) {
                fn(pg, rank, world, arg);
                ts_pg_free(pg);
            }
            ts_store_release(s);
            fflush(NULL);
            _exit(TS_MIN(atomic_load(&g_bad), 100));
        }
    }
    if (tcp) unsetenv("TS_DIST_TRANSPORT");
    double t0 = ts_time_now();
    int left = world;
    while (left > 0) {
        int status = 0;
        pid_t p = waitpid(-1, &status, WNOHANG);
        if (p <= 0) {
            if (ts_time_now() - t0 > 60) {
                fprintf(stderr, "run_procs: children still running after 60 s, killing them\n");
                for (int r = 0; r < world; r++) kill(pids[r], SIGKILL);
                tu_failures++;
                t0 = 1e18;
            }
            usleep(1000);
            continue;
        }
        int r = 0;
        while (r < world && pids[r] != p) r++;
        if (r == world) continue;
        left--;
        if (r == expect_killed) {
            CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
        } else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            fprintf(stderr, "run_procs: rank %d of %d %s %d\n", r, world,
                    WIFEXITED(status) ? "failed checks:" : "died with signal",
                    WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
            tu_failures++;
        }
    }
    tu_store_server_stop(&server);
}

/* ---- the collectives ------------------------------------------------------------------------------------------- */
static const int64_t LENS[] = {0, 1, 1009, (1 << 20) + 3};

static void fill(float *p, int64_t n, int rank) {
    for (int64_t i = 0; i < n; i++) p[i] = (float)((rank + 1) * (i % 7 + 1));
}

static void body_all_reduce(ts_process_group *pg, int rank, int world, void *arg) {
    TS_UNUSED(arg);
    double S = world * (world + 1) / 2.0;
    for (size_t li = 0; li < TS_ARRAY_LEN(LENS); li++) {
        int64_t n = LENS[li];
        ts_tensor *t = vec(n, TS_F32);
        float *p = ts_tensor_data_f32(t);
        for (int op = 0; op < 4; op++) {
            fill(p, n, rank);
            ROK(ts_all_reduce(pg, t, (ts_reduce_op)op, NULL));
            switch (op) {
            case TS_REDUCE_SUM: CHECK_VALUES(p, n, S * (i % 7 + 1), 0); break;
            case TS_REDUCE_AVG: CHECK_VALUES(p, n, S / world * (i % 7 + 1), 1e-5 * (i % 7 + 1) * world); break;
            case TS_REDUCE_MAX: CHECK_VALUES(p, n, world * (i % 7 + 1), 0); break;
            case TS_REDUCE_MIN: CHECK_VALUES(p, n, (i % 7 + 1), 0); break;
            }
        }
        /* the raw-buffer entry point (what DDP uses) */
        fill(p, n, rank);
        ROK(ts_all_reduce_buffer(pg, p, (size_t)n, TS_F32, TS_REDUCE_SUM, NULL));
        CHECK_VALUES(p, n, S * (i % 7 + 1), 0);
        /* bfloat16 (2-byte elements: odd lengths cross every 4-byte boundary); the values and their sums
         * (<= 36 x 7 = 252) are exact in bfloat16's 8 bits */
        ts_tensor *h = vec(n, TS_BF16), *hs = vec(n * world, TS_BF16);
        uint16_t *ph = ts_tensor_data(h), *phs = ts_tensor_data(hs);
        for (int op = 0; op < 4; op++) {
            fill(p, n, rank);
            ROK(ts_convert(ph, TS_BF16, p, TS_F32, (size_t)n));
            ROK(ts_all_reduce(pg, h, (ts_reduce_op)op, NULL));
            ROK(ts_convert(p, TS_F32, ph, TS_BF16, (size_t)n));
            switch (op) {
            case TS_REDUCE_SUM: CHECK_VALUES(p, n, S * (i % 7 + 1), 0); break;
            case TS_REDUCE_AVG: CHECK_VALUES(p, n, S / world * (i % 7 + 1), 0); break;
            case TS_REDUCE_MAX: CHECK_VALUES(p, n, world * (i % 7 + 1), 0); break;
            case TS_REDUCE_MIN: CHECK_VALUES(p, n, (i % 7 + 1), 0); break;
            }
        }
        for (int r = 0; r < world; r++) { /* block r of rank k holds (k + 1) (r + 1) (i % 7 + 1) */
            for (int64_t i = 0; i < n; i++) p[i] = (float)((rank + 1) * (r + 1) * (i % 7 + 1));
            ROK(ts_convert(phs + (size_t)r * (size_t)n, TS_BF16, p, TS_F32, (size_t)n));
        }
        if (world <= 4) { /* sums <= 10 x 4 x 7 = 280: exact up to 256, then steps of 2 */
            ROK(ts_reduce_scatter(pg, h, hs, TS_REDUCE_SUM, NULL));
            ROK(ts_convert(p, TS_F32, ph, TS_BF16, (size_t)n));
            CHECK_VALUES(p, n, S * (rank + 1) * (i % 7 + 1), 0);
        }
        ts_tensor_release(h);
        ts_tensor_release(hs);
        ts_tensor_release(t);
    }
}

static void body_rooted(ts_process_group *pg, int rank, int world, void *arg) {
    TS_UNUSED(arg);
    double S = world * (world + 1) / 2.0;
    for (size_t li = 0; li < TS_ARRAY_LEN(LENS); li++) {
        int64_t n = LENS[li];
        ts_tensor *t = vec(n, TS_F32);
        float *p = ts_tensor_data_f32(t);
        bool big = n > 100000;
        for (int root = 0; root < world; root++) {
            if (big && root != 0 && root != world - 1) continue; /* every root at the smaller sizes */
            for (int64_t i = 0; i < n; i++) p[i] = rank == root ? (float)(root * 1000 + i % 100) : -1.0f;
            ROK(ts_broadcast(pg, t, root, NULL));
            CHECK_VALUES(p, n, root * 1000 + i % 100, 0);
            fill(p, n, rank);
            ROK(ts_reduce(pg, t, root, TS_REDUCE_SUM, NULL));
            if (rank == root) CHECK_VALUES(p, n, S * (i % 7 + 1), 0);
        }
        fill(p, n, rank);
        ROK(ts_reduce(pg, t, world - 1, TS_REDUCE_MAX, NULL));
        if (rank == world - 1) CHECK_VALUES(p, n, world * (i % 7 + 1), 0);
        ts_tensor_release(t);
    }
    /* broadcast of another dtype */
    ts_tensor *b = vec(13, TS_U8);
    unsigned char *u = ts_tensor_data(b);
    for (int i = 0; i < 13; i++) u[i] = rank == 0 ? (unsigned char)(200 + i) : 0;
    ROK(ts_broadcast(pg, b, 0, NULL));
    for (int i = 0; i < 13; i++) RC(u[i] == 200 + i);
    ts_tensor_release(b);
}

static void body_gather_scatter(ts_process_group *pg, int rank, int world, void *arg) {
    TS_UNUSED(arg);
    double S = world * (world + 1) / 2.0;
    for (size_t li = 0; li < TS_ARRAY_LEN(LENS); li++) {
        int64_t n = LENS[li];
        ts_tensor *in = vec(n, TS_F32), *out = vec(n * world, TS_F32);
        float *pi = ts_tensor_data_f32(in), *po = ts_tensor_data_f32(out);
        for (int64_t i = 0; i < n; i++) pi[i] = (float)(rank * 10 + i % 5);
        ROK(ts_all_gather(pg, out, in, NULL));
        CHECK_VALUES(po, n * world, (i / (n ? n : 1)) * 10 + (i % (n ? n : 1)) % 5, 0);
        /* reduce_scatter: in = world blocks of n; rank r gets block r summed */
        for (int64_t j = 0; j < n * world; j++) po[j] = (float)((rank + 1) * (j % 9));
        memset(pi, 0, (size_t)n * 4);
        ROK(ts_reduce_scatter(pg, in, out, TS_REDUCE_SUM, NULL));
        CHECK_VALUES(pi, n, S * ((rank * n + i) % 9), 0);
        for (int64_t j = 0; j < n * world; j++) po[j] = (float)((rank + 1) * (j % 9));
        ROK(ts_reduce_scatter(pg, in, out, TS_REDUCE_MAX, NULL));
        CHECK_VALUES(pi, n, world * ((rank * n + i) % 9), 0);
        ts_tensor_release(in);
        ts_tensor_release(out);
    }
    ROK(ts_barrier(pg, NULL));
}

static void body_p2p_async(ts_process_group *pg, int rank, int world, void *arg) {
    TS_UNUSED(arg);
    double S = world * (world + 1) / 2.0;
    if (world > 1) {
        int next = (rank + 1) % world, prev = (rank + world - 1) % world;
        for (size_t li = 1; li < TS_ARRAY_LEN(LENS); li++) {
            int64_t n = LENS[li];
            ts_tensor *s = vec(n, TS_F32), *r = vec(n, TS_F32);
            float *ps = ts_tensor_data_f32(s), *pr = ts_tensor_data_f32(r);
            for (int64_t i = 0; i < n; i++) ps[i] = (float)(rank * 100 + i % 50);
            /* even ranks send first, odd ranks receive first: no cycle of blocked senders */
            if (rank % 2 == 0) {
                ROK(ts_send(pg, s, next, 700 + rank));
                ROK(ts_recv(pg, r, prev, 700 + prev));
            } else {
                ROK(ts_recv(pg, r, prev, 700 + prev));
                ROK(ts_send(pg, s, next, 700 + rank));
            }
            if (world % 2 == 1 && rank == world - 1) { /* odd ring: the last (even) rank pairs with rank 0 */
            }
            CHECK_VALUES(pr, n, prev * 100 + i % 50, 0);
            ts_tensor_release(s);
            ts_tensor_release(r);
        }
    }
    /* async works waited out of order, mixed with a blocking call */
    enum { K = 4 };
    ts_tensor *t[K];
    ts_work *w[K] = {0};
    int64_t sizes[K] = {5, (1 << 18) + 1, 77, 1 << 16};
    for (int k = 0; k < K; k++) {
        t[k] = vec(sizes[k], TS_F32);
        fill(ts_tensor_data_f32(t[k]), sizes[k], rank + k);
    }
    ROK(ts_all_reduce(pg, t[0], TS_REDUCE_SUM, &w[0]));
    ROK(ts_all_reduce(pg, t[1], TS_REDUCE_MAX, &w[1]));
    ROK(ts_all_reduce_buffer(pg, ts_tensor_data(t[2]), 77, TS_F32, TS_REDUCE_SUM, &w[2]));
    ROK(ts_barrier(pg, NULL)); /* blocking: runs after the queued work */
    ROK(ts_all_reduce(pg, t[3], TS_REDUCE_MIN, &w[3]));
    int order[K] = {3, 1, 0, 2};
    for (int j = 0; j < K; j++) {
        ROK(ts_work_wait(w[order[j]], -1));
        RC(ts_work_is_completed(w[order[j]]));
    }
    double Sk0 = S + 0 * world, Sk2 = S + 2.0 * world;
    CHECK_VALUES(ts_tensor_data_f32(t[0]), sizes[0], Sk0 * (i % 7 + 1), 0);
    CHECK_VALUES(ts_tensor_data_f32(t[1]), sizes[1], (world + 1) * (i % 7 + 1), 0);
    CHECK_VALUES(ts_tensor_data_f32(t[2]), sizes[2], Sk2 * (i % 7 + 1), 0);
    CHECK_VALUES(ts_tensor_data_f32(t[3]), sizes[3], (1 + 3) * (i % 7 + 1), 0);
    for (int k = 0; k < K; k++) {
        ts_work_free(w[k]);
        ts_tensor_release(t[k]);
    }
    /* free a work without waiting for it */
    ts_tensor *x = vec(1000, TS_F32);
    ts_work *wx = NULL;
    fill(ts_tensor_data_f32(x), 1000, rank);
    ROK(ts_all_reduce(pg, x, TS_REDUCE_SUM, &wx));
    ts_tensor_release(x); /* the work keeps it alive */
    ts_work_free(wx);
}

static void body_all(ts_process_group *pg, int rank, int world, void *arg) {
    body_all_reduce(pg, rank, world, arg);
    body_rooted(pg, rank, world, arg);
    body_gather_scatter(pg, rank, world, arg);
    body_p2p_async(pg, rank, world, arg);
}

static void test_threads_shm(void) {
    for (int w = 1; w <= 8; w++) {
        double t0 = ts_time_now();
        atomic_store(&g_bad, 0);
        run_threads(w, 60, body_all, NULL);
        CHECK(atomic_load(&g_bad) == 0);
        fprintf(stderr, "  %d thread ranks: %.2fs\n", w, ts_time_now() - t0);
    }
}

static void test_threads_tcp(void) {
    setenv("TS_DIST_TRANSPORT", "tcp", 1);
    for (int w = 2; w <= 5; w += 3) {
        atomic_store(&g_bad, 0);
        run_threads(w, 60, body_all, NULL);
        CHECK(atomic_load(&g_bad) == 0);
    }
    unsetenv("TS_DIST_TRANSPORT");
}

static void test_threads_small_ring_threshold(void) {
    /* force the ring algorithm at every size (and recursive doubling above) */
    setenv("TS_DIST_RING_THRESHOLD", "0", 1);
    for (int w = 3; w <= 4; w++) {
        atomic_store(&g_bad, 0);
        run_threads(w, 60, body_all_reduce, NULL);
        CHECK(atomic_load(&g_bad) == 0);
    }
    setenv("TS_DIST_RING_THRESHOLD", "100000000", 1);
    for (int w = 3; w <= 4; w++) {
        atomic_store(&g_bad, 0);
        run_threads(w, 60, body_all_reduce, NULL);
        CHECK(atomic_load(&g_bad) == 0);
    }
    unsetenv("TS_DIST_RING_THRESHOLD");
}

static void test_procs_shm(void) {
    for (int w = 2; w <= 4; w++) run_procs(w, 60, false, -1, body_all, NULL);
}

static void test_procs_tcp(void) {
    for (int w = 2; w <= 4; w++) run_procs(w, 60, true, -1, body_all, NULL);
}

/* ---- errors ----------------------------------------------------------------------------------------------------------- */
static void body_arg_errors(ts_process_group *pg, int rank, int world, void *arg) {
    TS_UNUSED(arg);
    ts_tensor *t = vec(10, TS_F32), *i32 = vec(10, TS_I32), *big = vec(7, TS_F32);
    RC(ts_broadcast(pg, t, world, NULL) == TS_ERR_INVALID_ARG);
    RC(strstr(ts_last_error(), "root") != NULL);
    RC(ts_reduce(pg, t, -1, TS_REDUCE_SUM, NULL) == TS_ERR_INVALID_ARG);
    RC(ts_all_reduce(pg, i32, TS_REDUCE_SUM, NULL) == TS_ERR_DTYPE);
    RC(ts_all_reduce_buffer(pg, ts_tensor_data(i32), 10, TS_I32, TS_REDUCE_MAX, NULL) == TS_ERR_DTYPE);
    RC(ts_all_reduce(pg, t, (ts_reduce_op)9, NULL) == TS_ERR_INVALID_ARG);
    RC(ts_all_gather(pg, big, t, NULL) == TS_ERR_SHAPE);
    RC(strstr(ts_last_error(), "[7]") && strstr(ts_last_error(), "[10]"));
    RC(ts_reduce_scatter(pg, t, big, TS_REDUCE_SUM, NULL) == TS_ERR_SHAPE);
    RC(ts_send(pg, t, rank, 0) == TS_ERR_INVALID_ARG);
    RC(ts_all_reduce(NULL, t, TS_REDUCE_SUM, NULL) == TS_ERR_INVALID_ARG);
    /* nothing was aborted by argument errors */
    ROK(ts_all_reduce(pg, t, TS_REDUCE_SUM, NULL));
    ts_tensor_release(t);
    ts_tensor_release(i32);
    ts_tensor_release(big);
}

static void body_size_mismatch(ts_process_group *pg, int rank, int world, void *arg) {
    TS_UNUSED(arg);
    int64_t n = rank == 1 ? 12 : 10;
    ts_tensor *t = vec(n, TS_F32);
    fill(ts_tensor_data_f32(t), n, rank);
    ts_status st = ts_all_reduce(pg, t, TS_REDUCE_SUM, NULL);
    RC(st != TS_OK);
    const char *e = ts_last_error();
    /* the rank that saw the other's header names both sizes; others see it abort */
    RC(strstr(e, "size mismatch") || strstr(e, "rank"));
    if (strstr(e, "size mismatch")) RC(strstr(e, "12") && strstr(e, "10"));
    /* the group is aborted: later calls fail fast */
    double t0 = ts_time_now();
    RC(ts_barrier(pg, NULL) != TS_OK);
    RC(ts_time_now() - t0 < 1.0);
    ts_tensor_release(t);
}

static atomic_int g_phase;

static void body_timeout(ts_process_group *pg, int rank, int world, void *arg) {
    TS_UNUSED(arg);
    ts_tensor *t = vec(100, TS_F32);
    if (rank == 0) {
        double t0 = ts_time_now();
        RC(ts_all_reduce(pg, t, TS_REDUCE_SUM, NULL) == TS_ERR_TIMEOUT);
        RC(strstr(ts_last_error(), "rank 1") != NULL);
        RC(strstr(ts_last_error(), "all_reduce") != NULL);
        double dt = ts_time_now() - t0;
        RC(dt > 0.9 && dt < 3.0);
        atomic_store(&g_phase, 1);
    } else {
        while (!atomic_load(&g_phase)) usleep(1000); /* never calls */
    }
    ts_tensor_release(t);
}

static void body_work_timeout(ts_process_group *pg, int rank, int world, void *arg) {
    TS_UNUSED(arg);
    ts_tensor *t = vec(100, TS_F32);
    if (rank == 0) {
        ts_work *w = NULL;
        ROK(ts_all_reduce(pg, t, TS_REDUCE_SUM, &w));
        double t0 = ts_time_now();
        RC(ts_work_wait(w, 0.3) == TS_ERR_TIMEOUT);
        RC(strstr(ts_last_error(), "all_reduce") && strstr(ts_last_error(), "0.3 s"));
        RC(ts_time_now() - t0 < 1.5);
        ts_work_free(w);
        /* aborted: fails fast with the reason */
        RC(ts_barrier(pg, NULL) == TS_ERR_TIMEOUT);
        RC(strstr(ts_last_error(), "aborted") != NULL);
        atomic_store(&g_phase, 1);
    } else {
        while (!atomic_load(&g_phase)) usleep(1000);
    }
    ts_tensor_release(t);
}

/* ts_work_wait_for only waits: an expired wait aborts nothing, and the work completes once the peer arrives. */
static void body_work_wait_for(ts_process_group *pg, int rank, int world, void *arg) {
    TS_UNUSED(arg);
    ts_tensor *t = vec(100, TS_F32);
    float *p = ts_tensor_data(t);
    for (int i = 0; i < 100; i++) p[i] = (float)(rank + 1);
    if (rank == 0) {
        ts_work *w = NULL;
        ROK(ts_all_reduce(pg, t, TS_REDUCE_SUM, &w));
        double t0 = ts_time_now();
        RC(!ts_work_wait_for(w, 0.2) && !ts_work_is_completed(w));
        RC(ts_time_now() - t0 >= 0.15);
        atomic_store(&g_phase, 1); /* now the peer calls */
        bool done = false;
        for (int i = 0; i < 300 && !done; i++) done = ts_work_wait_for(w, 0.1);
        RC(done);
        ROK(ts_work_wait(w, 0));
        ts_work_free(w);
    } else {
        while (!atomic_load(&g_phase)) usleep(1000);
        ROK(ts_all_reduce(pg, t, TS_REDUCE_SUM, NULL));
    }
    RC(p[0] == (float)(world * (world + 1) / 2) && p[99] == p[0]);
    RC(ts_work_wait_for(NULL, 1.0));
    ts_tensor_release(t);
}

static void body_abort(ts_process_group *pg, int rank, int world, void *arg) {
    TS_UNUSED(arg);
    ts_tensor *t = vec(1 << 20, TS_F32);
    if (rank == 1) {
        usleep(100 * 1000);
        ts_pg_abort(pg, "testing abort");
        RC(ts_all_reduce(pg, t, TS_REDUCE_SUM, NULL) != TS_OK);
        RC(strstr(ts_last_error(), "testing abort") != NULL);
    } else {
        double t0 = ts_time_now();
        ts_status st = ts_all_reduce(pg, t, TS_REDUCE_SUM, NULL);
        RC(st == TS_ERR_REMOTE);
        RC(strstr(ts_last_error(), "rank 1") != NULL);
        RC(ts_time_now() - t0 < 5);
    }
    ts_tensor_release(t);
}

static void test_errors(void) {
    atomic_store(&g_bad, 0);
    run_threads(2, 30, body_arg_errors, NULL);
    run_threads(3, 30, body_size_mismatch, NULL);
    atomic_store(&g_phase, 0);
    run_threads(2, 1.0, body_timeout, NULL);
    atomic_store(&g_phase, 0);
    run_threads(2, 30, body_work_timeout, NULL);
    atomic_store(&g_phase, 0);
    run_threads(2, 30, body_work_wait_for, NULL);
    run_threads(3, 30, body_abort, NULL);
    CHECK(atomic_load(&g_bad) == 0);

    ts_store *s = NULL;
    CHECK_OK(ts_store_memory_new(&s));
    ts_pg_options o = TS_PG_OPTIONS_INIT;
    o.store = s;
    o.rank = 0;
    o.world_size = 1;
    o.backend = "carrier-pigeon";
    ts_process_group *pg = NULL;
    CHECK_STATUS(ts_pg_new(&o, &pg), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("carrier-pigeon");
    o.backend = "mpi";
    CHECK(ts_pg_new(&o, &pg) != TS_OK || (ts_pg_free(pg), true));
    o.backend = "builtin";
    o.group_name = "one";
    CHECK_OK(ts_pg_new(&o, &pg));
    CHECK(pg && strcmp(ts_pg_backend_name(pg), "builtin") == 0);
    ts_pg_free(pg);
    ts_store_release(s);
}

/* A rank SIGKILLs itself in the middle of a collective; the others must
 * return TS_ERR_REMOTE or TS_ERR_TIMEOUT naming a rank within the 3 s timeout. */
static void body_killed(ts_process_group *pg, int rank, int world, void *arg) {
    TS_UNUSED(arg);
    ts_tensor *t = vec(4 << 20, TS_F32);
    fill(ts_tensor_data_f32(t), 4 << 20, rank);
    ROK(ts_all_reduce(pg, t, TS_REDUCE_SUM, NULL)); /* everyone is connected and in step */
    if (rank == 1) {
        ts_work *w = NULL;
        ts_all_reduce(pg, t, TS_REDUCE_SUM, &w);
        usleep(2000);
        raise(SIGKILL);
    }
    /* rank 1 may finish its one call with ours; the next one must fail */
    ts_status st = TS_OK;
    double t0 = 0, dt = 0;
    for (int k = 0; k < 5 && st == TS_OK; k++) {
        t0 = ts_time_now();
        st = ts_all_reduce(pg, t, TS_REDUCE_SUM, NULL);
        dt = ts_time_now() - t0;
    }
    RC(st == TS_ERR_REMOTE || st == TS_ERR_TIMEOUT);
    RC(strstr(ts_last_error(), "rank ") != NULL);
    RC(dt < 4.0);
    if (getenv("TS_TEST_VERBOSE") || st == TS_OK || dt >= 4.0)
        fprintf(stderr, "rank %d: %s after %.2fs: %s\n", rank, ts_status_name(st), dt, ts_last_error());
    ts_tensor_release(t);
}

static void test_killed_rank(void) {
    run_procs(3, 3.0, false, 1, body_killed, NULL);
    run_procs(3, 3.0, true, 1, body_killed, NULL);
    run_procs(2, 3.0, false, 1, body_killed, NULL);
}

static void test_no_leaks(void) {
    DIR *d = opendir("/dev/shm");
    if (!d) return;
    char prefix[64];
    snprintf(prefix, sizeof prefix, "tessera-%d-", (int)getpid());
    struct dirent *e;
    int found = 0;
    while ((e = readdir(d))) {
        if (strncmp(e->d_name, "tessera-", 8) != 0) continue;
        int pid = atoi(e->d_name + 8);
        if (pid > 0 && (kill(pid, 0) == 0 || pid == (int)getpid())) continue; /* a live process's */
        fprintf(stderr, "leaked shared memory segment /dev/shm/%s\n", e->d_name);
        found++;
    }
    closedir(d);
    CHECK(found == 0);
}

TU_MAIN(T(test_threads_shm), T(test_threads_tcp), T(test_threads_small_ring_threshold), T(test_procs_shm),
        T(test_procs_tcp), T(test_errors), T(test_killed_rank), T(test_no_leaks))
