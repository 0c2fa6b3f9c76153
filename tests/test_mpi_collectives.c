/*
 * tests/test_mpi_collectives.c — the "mpi" process-group backend
 * (src/distributed/mpi/mpi.c): every collective for lengths 0, 1, 1009 and 2^20 + 3
 * and every reduce op against values computed here (small integers in f32,
 * exact), send/recv, the pieces MPI's int counts force (TS_MPI_MAX_COUNT
 * lowered so that 2^20 + 3 elements take 1049 calls), size mismatches
 * (send/recv; collectives under TS_MPI_CHECK=1), a rank that skips a
 * collective (the others get TS_ERR_TIMEOUT within the 1 s timeout, it gets
 * TS_ERR_REMOTE), ts_pg_abort, a rank that never creates the group, a
 * rank/world that disagrees with MPI's, and heartbeats without a store (rank
 * 1 pauses its heartbeat thread and stays away from a barrier: the others
 * fail within the 1.5 s heartbeat timeout, not the 60 s collective timeout,
 * naming it).
 *
 * Three ways to run it:
 *   test_mpi_collectives               one process: MPI singleton, world size 1
 *   test_mpi_collectives --np N [--mpiexec PATH]
 *                                      starts itself under mpirun -n N (ctest:
 *                                      test_mpi_collectives_np2/3/4) and waits
 *                                      at most 300 s for it
 *   (started by mpirun)                one rank; exits with its failure count
 *
 * mpirun flags: --oversubscribe (4 ranks on 2 cores), --bind-to none (the
 * ranks share the cores with whatever else runs), --allow-run-as-root only
 * when running as root (containers, CI), --mca btl self,vader (shared memory
 * only: no probing of network interfaces, nothing leaves the host), and
 * OMPI_MCA_btl_vader_single_copy_mechanism=none unless set: vader's default
 * single copy (CMA, process_vm_readv) is refused in containers without
 * CAP_SYS_PTRACE (Docker's default), and large messages then fail with
 * "Read -1, expected ..., errno = 1"; copying through the shared-memory
 * FIFOs works everywhere.
 */
#include "test_util.h"

#include "core/internal.h"
#include "distributed/backend.h"
#include "distributed/pg.h"

#include <errno.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef TS_HAVE_MPI
int main(void) {
    printf("skip: Tessera was built without MPI (TS_WITH_MPI=OFF or no MPI found)\n");
    return 77;
}
#else

static int g_rank, g_world;

/* CHECK that prints this rank. */
#define RC(cond)                                                                                                    \
    do {                                                                                                            \
        tu_checks++;                                                                                                \
        if (!(cond)) {                                                                                              \
            tu_failures++;                                                                                          \
            fprintf(stderr, "%s:%d: rank %d/%d: CHECK failed: %s\n", __FILE__, __LINE__, g_rank, g_world, #cond);   \
        }                                                                                                           \
    } while (0)
#define ROK(expr)                                                                                                   \
    do {                                                                                                            \
        tu_checks++;                                                                                                \
        ts_status r_s = (expr);                                                                                     \
        if (r_s != TS_OK) {                                                                                         \
            tu_failures++;                                                                                          \
            fprintf(stderr, "%s:%d: rank %d/%d: %s -> %s: %s\n", __FILE__, __LINE__, g_rank, g_world, #expr,        \
                    ts_status_name(r_s), ts_last_error());                                                          \
        }                                                                                                           \
    } while (0)
/* The error message mentions needle. */
#define RMSG(needle)                                                                                                \
    do {                                                                                                            \
        tu_checks++;                                                                                                \
        if (!strstr(ts_last_error(), (needle))) {                                                                   \
            tu_failures++;                                                                                          \
            fprintf(stderr, "%s:%d: rank %d/%d: error '%s' does not mention '%s'\n", __FILE__, __LINE__, g_rank,   \
                    g_world, ts_last_error(), (needle));                                                            \
        }                                                                                                           \
    } while (0)
/* Compares n floats with want(i); reports the first difference. */
#define CHECK_VALUES(ptr, n, expr_of_i, tol)                                                                        \
    do {                                                                                                            \
        const float *cv_p = (ptr);                                                                                  \
        tu_checks++;                                                                                                \
        for (int64_t i = 0; i < (int64_t)(n); i++) {                                                                \
            double cv_w = (expr_of_i);                                                                              \
            if (!(fabs(cv_p[i] - cv_w) <= (tol))) {                                                                 \
                tu_failures++;                                                                                      \
                fprintf(stderr, "%s:%d: rank %d/%d: [%lld] = %g, expected %g\n", __FILE__, __LINE__, g_rank,        \
                        g_world, (long long)i, (double)cv_p[i], cv_w);                                              \
                break;                                                                                              \
            }                                                                                                       \
        }                                                                                                           \
    } while (0)

static ts_tensor *vec(int64_t n, ts_dtype dt) {
    ts_tensor *t = NULL;
    if (ts_tensor_empty(ts_device_cpu(), dt, 1, &n, &t) != TS_OK) {
        fprintf(stderr, "vec: %s\n", ts_last_error());
        abort();
    }
    return t;
}

/* A group over MPI_COMM_WORLD the way an application under mpirun makes one:
 * backend "mpi", no store, no MASTER_ADDR. */
static ts_process_group *mpi_group(const char *name, double timeout) {
    ts_pg_options o = TS_PG_OPTIONS_INIT;
    o.backend = "mpi";
    o.group_name = name;
    o.timeout_s = timeout;
    ts_process_group *pg = NULL;
    ROK(ts_pg_new(&o, &pg));
    if (pg) RC(ts_pg_rank(pg) == g_rank && ts_pg_size(pg) == g_world);
    return pg;
}

static const int64_t LENS[] = {0, 1, 1009, (1 << 20) + 3};

static void fill(float *p, int64_t n, int rank) {
    for (int64_t i = 0; i < n; i++) p[i] = (float)((rank + 1) * (i % 7 + 1));
}

/* ---- the collectives ---------------------------------------------------------------------------------------- */
static void body_all_reduce(ts_process_group *pg, const int64_t *lens, int nlens) {
    int rank = g_rank, world = g_world;
    double S = world * (world + 1) / 2.0;
    for (int li = 0; li < nlens; li++) {
        int64_t n = lens[li];
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
        fill(p, n, rank);
        ROK(ts_all_reduce_buffer(pg, p, (size_t)n, TS_F32, TS_REDUCE_SUM, NULL));
        CHECK_VALUES(p, n, S * (i % 7 + 1), 0);
        ts_tensor_release(t);
    }
}

static void body_rooted(ts_process_group *pg, const int64_t *lens, int nlens) {
    int rank = g_rank, world = g_world;
    double S = world * (world + 1) / 2.0;
    for (int li = 0; li < nlens; li++) {
        int64_t n = lens[li];
        ts_tensor *t = vec(n, TS_F32);
        float *p = ts_tensor_data_f32(t);
        bool big = n > 100000;
        for (int root = 0; root < world; root++) {
            if (big && root != 0 && root != world - 1) continue; /* every root at the smaller sizes */
            for (int64_t i = 0; i < n; i++) p[i] = rank == root ? (float)(root * 1000 + i % 100) : -1.0f;
            ROK(ts_broadcast(pg, t, root, NULL));
            CHECK_VALUES(p, n, root * 1000 + i % 100, 0);
            for (int op = 0; op < 4; op++) {
                if (big && op != TS_REDUCE_SUM && root != 0) continue;
                fill(p, n, rank);
                ROK(ts_reduce(pg, t, root, (ts_reduce_op)op, NULL));
                if (rank != root) continue;
                switch (op) {
                case TS_REDUCE_SUM: CHECK_VALUES(p, n, S * (i % 7 + 1), 0); break;
                case TS_REDUCE_AVG: CHECK_VALUES(p, n, S / world * (i % 7 + 1), 1e-5 * (i % 7 + 1) * world); break;
                case TS_REDUCE_MAX: CHECK_VALUES(p, n, world * (i % 7 + 1), 0); break;
                case TS_REDUCE_MIN: CHECK_VALUES(p, n, (i % 7 + 1), 0); break;
                }
            }
        }
        ts_tensor_release(t);
    }
    /* broadcast of other dtypes */
    ts_tensor *b = vec(13, TS_U8), *l = vec(5, TS_I64);
    unsigned char *u = ts_tensor_data(b);
    int64_t *q = ts_tensor_data(l);
    for (int i = 0; i < 13; i++) u[i] = rank == 0 ? (unsigned char)(200 + i) : 0;
    for (int i = 0; i < 5; i++) q[i] = rank == world - 1 ? (int64_t)1 << (40 + i) : 0;
    ROK(ts_broadcast(pg, b, 0, NULL));
    ROK(ts_broadcast(pg, l, world - 1, NULL));
    for (int i = 0; i < 13; i++) RC(u[i] == 200 + i);
    for (int i = 0; i < 5; i++) RC(q[i] == (int64_t)1 << (40 + i));
    ts_tensor_release(b);
    ts_tensor_release(l);
}

static void body_gather_scatter(ts_process_group *pg, const int64_t *lens, int nlens) {
    int rank = g_rank, world = g_world;
    double S = world * (world + 1) / 2.0;
    for (int li = 0; li < nlens; li++) {
        int64_t n = lens[li], nn = n ? n : 1;
        ts_tensor *in = vec(n, TS_F32), *out = vec(n * world, TS_F32);
        float *pi = ts_tensor_data_f32(in), *po = ts_tensor_data_f32(out);
        for (int64_t i = 0; i < n; i++) pi[i] = (float)(rank * 10 + i % 5);
        memset(po, 0xff, (size_t)(n * world) * 4);
        ROK(ts_all_gather(pg, out, in, NULL));
        CHECK_VALUES(po, n * world, (i / nn) * 10 + (i % nn) % 5, 0);
        /* reduce_scatter: in = world blocks of n; rank r gets block r reduced */
        for (int op = 0; op < 4; op++) {
            for (int64_t j = 0; j < n * world; j++) po[j] = (float)((rank + 1) * (j % 9 + 1));
            memset(pi, 0, (size_t)n * 4);
            ROK(ts_reduce_scatter(pg, in, out, (ts_reduce_op)op, NULL));
            switch (op) {
            case TS_REDUCE_SUM: CHECK_VALUES(pi, n, S * ((rank * n + i) % 9 + 1), 0); break;
            case TS_REDUCE_AVG:
                CHECK_VALUES(pi, n, S / world * ((rank * n + i) % 9 + 1), 1e-5 * world * ((rank * n + i) % 9 + 1));
                break;
            case TS_REDUCE_MAX: CHECK_VALUES(pi, n, world * ((rank * n + i) % 9 + 1), 0); break;
            case TS_REDUCE_MIN: CHECK_VALUES(pi, n, ((rank * n + i) % 9 + 1), 0); break;
            }
        }
        ts_tensor_release(in);
        ts_tensor_release(out);
    }
    ROK(ts_barrier(pg, NULL));
}

static void body_p2p_async(ts_process_group *pg, const int64_t *lens, int nlens) {
    int rank = g_rank, world = g_world;
    double S = world * (world + 1) / 2.0;
    if (world > 1) {
        int next = (rank + 1) % world, prev = (rank + world - 1) % world;
        for (int li = 0; li < nlens; li++) {
            int64_t n = lens[li];
            ts_tensor *s = vec(n, TS_F32), *r = vec(n, TS_F32);
            float *ps = ts_tensor_data_f32(s), *pr = ts_tensor_data_f32(r);
            for (int64_t i = 0; i < n; i++) ps[i] = (float)(rank * 100 + i % 50);
            memset(pr, 0xff, (size_t)n * 4);
            /* even ranks send first, odd ranks receive first (an odd ring's last rank waits a little) */
            if (rank % 2 == 0) {
                ROK(ts_send(pg, s, next, 700 + rank));
                ROK(ts_recv(pg, r, prev, 700 + prev));
            } else {
                ROK(ts_recv(pg, r, prev, 700 + prev));
                ROK(ts_send(pg, s, next, 700 + rank));
            }
            CHECK_VALUES(pr, n, prev * 100 + i % 50, 0);
            ts_tensor_release(s);
            ts_tensor_release(r);
        }
    }
    /* async works waited out of order, mixed with a blocking call (the communication thread calls MPI) */
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
    ROK(ts_barrier(pg, NULL));
    ROK(ts_all_reduce(pg, t[3], TS_REDUCE_MIN, &w[3]));
    int order[K] = {3, 1, 0, 2};
    for (int j = 0; j < K; j++) ROK(ts_work_wait(w[order[j]], -1));
    CHECK_VALUES(ts_tensor_data_f32(t[0]), sizes[0], S * (i % 7 + 1), 0);
    CHECK_VALUES(ts_tensor_data_f32(t[1]), sizes[1], (world + 1) * (i % 7 + 1), 0);
    CHECK_VALUES(ts_tensor_data_f32(t[2]), sizes[2], (S + 2.0 * world) * (i % 7 + 1), 0);
    CHECK_VALUES(ts_tensor_data_f32(t[3]), sizes[3], (1 + 3) * (i % 7 + 1), 0);
    for (int k = 0; k < K; k++) {
        ts_work_free(w[k]);
        ts_tensor_release(t[k]);
    }
}

static void test_collectives(void) {
    ts_process_group *pg = mpi_group("main", 120);
    if (!pg) return;
    RC(strcmp(ts_pg_backend_name(pg), "mpi") == 0);
    const char *lr = getenv("OMPI_COMM_WORLD_LOCAL_RANK");
    if (lr) RC(ts_pg_local_rank(pg) == atoi(lr));
    int n = (int)TS_ARRAY_LEN(LENS);
    body_all_reduce(pg, LENS, n);
    body_rooted(pg, LENS, n);
    body_gather_scatter(pg, LENS, n);
    body_p2p_async(pg, LENS, n);
    ts_pg_free(pg);
}

/* MPI counts are int: with TS_MPI_MAX_COUNT=1000, all_reduce / broadcast / reduce / send / recv
 * go in pieces; all_gather and reduce_scatter of more than that per rank are refused. */
static void test_pieces(void) {
    setenv("TS_MPI_MAX_COUNT", "1000", 1);
    ts_process_group *pg = mpi_group("pieces", 120);
    unsetenv("TS_MPI_MAX_COUNT");
    if (!pg) return;
    const int64_t lens[] = {0, 1, 999, 1000, 1001, 2000, (1 << 20) + 3};
    int n = (int)TS_ARRAY_LEN(lens);
    body_all_reduce(pg, lens, n);
    body_rooted(pg, lens, n);
    body_p2p_async(pg, lens, n);
    const int64_t fit[] = {0, 1, 1000};
    body_gather_scatter(pg, fit, 3);
    ts_pg_free(pg);
    /* The refusal aborts the group: in a group of its own, so that no rank can still be
     * finishing an earlier collective when the others' abort notices arrive. */
    setenv("TS_MPI_MAX_COUNT", "1000", 1);
    pg = mpi_group("pieces-refused", 120);
    unsetenv("TS_MPI_MAX_COUNT");
    if (!pg) return;
    ts_tensor *in = vec(1001, TS_F32), *out = vec(1001 * g_world, TS_F32);
    RC(ts_all_gather(pg, out, in, NULL) == TS_ERR_UNSUPPORTED);
    RMSG("1001 elements per rank");
    RC(ts_reduce_scatter(pg, in, out, TS_REDUCE_SUM, NULL) != TS_OK); /* aborted now */
    ts_tensor_release(in);
    ts_tensor_release(out);
    ts_pg_free(pg);
}

/* The backend's table on raw buffers: all_gather whose input is its own block of the output,
 * reduce_scatter whose output overlaps its input. */
static void test_aliasing(void) {
    atomic_int aborted;
    atomic_init(&aborted, 0);
    ts__backend_ctx ctx = {NULL, g_rank, g_world, 0, 1, 60.0, "aliasing", &aborted, NULL};
    void *st = NULL;
    ROK(ts__mpi_backend.init(&ctx, &st));
    if (!st) return;
    int64_t n = 1009, w = g_world, r = g_rank;
    float *buf = malloc(sizeof(float) * (size_t)(n * w));
    for (int64_t i = 0; i < n * w; i++) buf[i] = -1;
    for (int64_t i = 0; i < n; i++) buf[r * n + i] = (float)(r * 10 + i % 5);
    ROK(ts__mpi_backend.all_gather(st, buf, buf + r * n, (size_t)n, TS_F32));
    CHECK_VALUES(buf, n * w, (i / n) * 10 + (i % n) % 5, 0);
    for (int64_t j = 0; j < n * w; j++) buf[j] = (float)((r + 1) * (j % 9 + 1));
    ROK(ts__mpi_backend.reduce_scatter(st, buf, buf, (size_t)n, TS_F32, TS_REDUCE_SUM)); /* out = block 0 of in */
    double S = w * (w + 1) / 2.0;
    CHECK_VALUES(buf, n, S * ((r * n + i) % 9 + 1), 0);
    ROK(ts__mpi_backend.barrier(st));
    ts__mpi_backend.destroy(st);
    free(buf);
}

/* send/recv of the wrong size: the receiver says so (and aborts); the others learn it from its notice. */
static void test_p2p_mismatch(void) {
    if (g_world < 2) return;
    for (int more = 0; more < 2; more++) {
        ts_process_group *pg = mpi_group(more ? "p2p-more" : "p2p-fewer", 10);
        if (!pg) return;
        ts_tensor *t10 = vec(10, TS_F32), *tx = vec(more ? 12 : 8, TS_F32);
        memset(ts_tensor_data(tx), 0, ts_tensor_nbytes(tx));
        if (g_rank == 0) ROK(ts_send(pg, tx, 1, 5));
        if (g_rank == 1) {
            RC(ts_recv(pg, t10, 0, 5) == TS_ERR_SHAPE);
            RMSG("size mismatch");
            RMSG(more ? "sent more than the 10" : "sent 8 float32 elements");
            if (more) RMSG("MPI_ERR_TRUNCATE"); /* MPI's own error string */
        }
        double t0 = ts_time_now();
        ts_status st = ts_barrier(pg, NULL);
        RC(st != TS_OK && ts_time_now() - t0 < 5);
        if (g_rank != 1) {
            RC(st == TS_ERR_REMOTE);
            RMSG("rank 1 aborted the process group");
        }
        ts_tensor_release(t10);
        ts_tensor_release(tx);
        ts_pg_free(pg);
    }
    /* a tag MPI cannot carry */
    ts_process_group *pg = mpi_group("p2p-tag", 10);
    if (!pg) return;
    ts_tensor *t = vec(3, TS_F32);
    RC(ts_send(pg, t, (g_rank + 1) % g_world, -4) == TS_ERR_INVALID_ARG);
    RMSG("tag -4 is outside");
    ts_tensor_release(t);
    ts_pg_free(pg);
}

/* TS_MPI_CHECK=1: ranks that disagree about a collective's size get an error naming both sizes. */
static void test_checked_mismatch(void) {
    setenv("TS_MPI_CHECK", "1", 1);
    ts_process_group *pg = mpi_group("checked", 10);
    unsetenv("TS_MPI_CHECK");
    if (!pg) return;
    const int64_t lens[] = {0, 1009};
    body_all_reduce(pg, lens, 2); /* agreeing ranks pass */
    if (g_world > 1) {
        int64_t n = g_rank == 1 ? 12 : 10;
        ts_tensor *t = vec(n, TS_F32);
        fill(ts_tensor_data_f32(t), n, g_rank);
        /* every rank finds it, unless a faster rank's abort notice (carrying the same message) comes first */
        ts_status st = ts_all_reduce(pg, t, TS_REDUCE_SUM, NULL);
        RC(st == TS_ERR_SHAPE || st == TS_ERR_REMOTE);
        RMSG("size mismatch");
        RMSG("between 10 and 12 elements");
        ts_tensor_release(t);
    }
    ts_pg_free(pg);
}

/* Rank 0 skips a collective: the others time out within the group's 1 s (never hang), and rank 0
 * learns of their abort in its next call. */
static void test_timeout(void) {
    if (g_world < 2) return;
    ts_process_group *pg = mpi_group("timeout", 1.0);
    if (!pg) return;
    ts_tensor *t = vec(1000, TS_F32);
    fill(ts_tensor_data_f32(t), 1000, g_rank);
    if (g_rank == 0) {
        usleep(2500 * 1000); /* the others time out meanwhile */
        double t0 = ts_time_now();
        RC(ts_barrier(pg, NULL) == TS_ERR_REMOTE);
        RMSG("aborted the process group");
        RMSG("timed out");
        RC(ts_time_now() - t0 < 1.0);
    } else {
        /* The first of ranks 1.. to reach its deadline times out; the others may see its
         * abort notice just before their own deadline (TS_ERR_REMOTE, "... timed out"). */
        double t0 = ts_time_now();
        ts_status st = ts_all_reduce(pg, t, TS_REDUCE_SUM, NULL);
        double dt = ts_time_now() - t0;
        RC(st == TS_ERR_TIMEOUT || (st == TS_ERR_REMOTE && g_world > 2));
        RMSG("all_reduce timed out after 1 s");
        RMSG("MPI cannot tell which");
        RC(dt > 0.9 && dt < 3.0);
        /* aborted: fails fast with the reason */
        t0 = ts_time_now();
        RC(ts_barrier(pg, NULL) == st);
        RMSG("aborted");
        RC(ts_time_now() - t0 < 0.5);
    }
    ts_tensor_release(t); /* rank 0 never joins: MPI will not write into it */
    ts_pg_free(pg);
}

/* ts_pg_abort on rank 1 while the others are inside an all-reduce: TS_ERR_REMOTE naming it. */
static void test_abort(void) {
    if (g_world < 2) return;
    ts_process_group *pg = mpi_group("abort", 30);
    if (!pg) return;
    ts_tensor *t = vec(1 << 20, TS_F32);
    fill(ts_tensor_data_f32(t), 1 << 20, g_rank);
    if (g_rank == 1) {
        usleep(200 * 1000);
        ts_pg_abort(pg, "testing abort");
        RC(ts_all_reduce(pg, t, TS_REDUCE_SUM, NULL) != TS_OK);
        RMSG("testing abort");
    } else {
        double t0 = ts_time_now();
        RC(ts_all_reduce(pg, t, TS_REDUCE_SUM, NULL) == TS_ERR_REMOTE);
        RMSG("rank 1 aborted the process group: testing abort");
        RC(ts_time_now() - t0 < 5);
    }
    ts_tensor_release(t);
    ts_pg_free(pg);
}

/* An asynchronous all-reduce that rank 0 waits for with a short timeout while the others never
 * call: pg.c aborts from the waiting thread while the communication thread polls MPI. */
static void test_work_timeout(void) {
    if (g_world < 2) return;
    ts_process_group *pg = mpi_group("work-timeout", 30);
    if (!pg) return;
    ts_tensor *t = vec(100, TS_F32);
    if (g_rank == 0) {
        ts_work *w = NULL;
        ROK(ts_all_reduce(pg, t, TS_REDUCE_SUM, &w));
        double t0 = ts_time_now();
        RC(ts_work_wait(w, 0.3) == TS_ERR_TIMEOUT);
        RMSG("0.3 s");
        RC(ts_time_now() - t0 < 1.5);
        t0 = ts_time_now();
        ts_work_free(w); /* the communication thread returns promptly */
        RC(ts_time_now() - t0 < 1.5);
    } else {
        usleep(1000 * 1000);
        double t0 = ts_time_now();
        RC(ts_barrier(pg, NULL) == TS_ERR_REMOTE);
        RMSG("rank 0 aborted the process group");
        RC(ts_time_now() - t0 < 5);
    }
    ts_tensor_release(t);
    ts_pg_free(pg);
}

/* Heartbeats under plain mpirun (no store: addresses exchanged by the backend): rank 1 goes
 * silent and skips a barrier; the others fail within the heartbeat timeout naming it. */
static void test_heartbeat(void) {
    ts_pg_options o = TS_PG_OPTIONS_INIT;
    o.backend = "mpi";
    o.group_name = "heartbeat";
    o.timeout_s = 60;
    o.heartbeat_timeout_s = 1.5;
    ts_process_group *pg = NULL;
    ROK(ts_pg_new(&o, &pg));
    if (!pg) return;
    RC(ts_pg_heartbeat_timeout(pg) == (g_world > 1 ? 1.5 : 0.0));
    ROK(ts_barrier(pg, NULL));
    if (g_world < 2) {
        ts_pg_free(pg);
        return;
    }
    if (g_rank == 1) {
        usleep(300 * 1000); /* heartbeats saying the barrier is done */
        ts__pg_heartbeat_pause(pg, true);
        usleep(4000 * 1000);
        ts__pg_heartbeat_pause(pg, false);
        ts_barrier(pg, NULL); /* may match the others' abandoned one, or see their notices */
    } else {
        double t0 = ts_time_now();
        ts_status st = ts_barrier(pg, NULL);
        double dt = ts_time_now() - t0;
        /* the first to notice says TIMEOUT; another may get its abort notice first */
        RC(st == TS_ERR_TIMEOUT || (st == TS_ERR_REMOTE && g_world > 2));
        RMSG("rank 1 (host ");
        RMSG("has not been heard from for");
        if (st == TS_ERR_TIMEOUT) RMSG("waiting in collective #2 barrier");
        RC(dt > 1.0 && dt < 5.0);
    }
    ts_pg_free(pg);
}

/* Positions that disagree with MPI's are refused before any communication. */
static void test_rank_mismatch(void) {
    ts_store *s = NULL;
    ROK(ts_store_memory_new(&s));
    ts_pg_options o = TS_PG_OPTIONS_INIT;
    o.backend = "mpi";
    ts_process_group *pg = NULL;
    if (g_world > 1) { /* a group of one over a private store, inside a world of several */
        o.store = s;
        o.rank = 0;
        o.world_size = 1;
    } else { /* mpirun's variables claiming rank 1 of 2 in a singleton */
        setenv("OMPI_COMM_WORLD_RANK", "1", 1);
        setenv("OMPI_COMM_WORLD_SIZE", "2", 1);
    }
    RC(ts_pg_new(&o, &pg) == TS_ERR_INVALID_ARG);
    char want[64];
    snprintf(want, sizeof want, "MPI says this process is rank %d of %d", g_rank, g_world);
    RMSG(want);
    RMSG(g_world > 1 ? "rank 0 of world size 1" : "rank 1 of world size 2");
    if (g_world == 1) {
        setenv("OMPI_COMM_WORLD_RANK", "0", 1);
        setenv("OMPI_COMM_WORLD_SIZE", "1", 1);
    }
    ts_pg_free(pg);
    ts_store_release(s);
    /* env:// with no MASTER_ADDR means the MPI environment too (tessera bench allreduce uses it) */
    ts_pg_options e = TS_PG_OPTIONS_INIT;
    e.backend = "mpi";
    e.init_method = "env://";
    e.group_name = "env";
    ROK(ts_pg_new(&e, &pg));
    if (pg) ROK(ts_barrier(pg, NULL));
    ts_pg_free(pg);
}

/* Rank 0 never creates the group: the others' MPI_Comm_idup times out. Last: MPI_COMM_WORLD's
 * collectives are out of step afterwards. */
static void test_init_timeout(void) {
    if (g_world < 2 || g_rank == 0) return;
    ts_pg_options o = TS_PG_OPTIONS_INIT;
    o.backend = "mpi";
    o.group_name = "never";
    o.timeout_s = 1.0;
    ts_process_group *pg = NULL;
    double t0 = ts_time_now();
    RC(ts_pg_new(&o, &pg) == TS_ERR_TIMEOUT);
    RMSG("every rank must create the group");
    RC(ts_time_now() - t0 < 3.0);
    RC(pg == NULL);
}

/* ---- running ---------------------------------------------------------------------------------------------------- */
/* --np N: this program under mpirun -n N; returns its exit status (1 on a hang). */
static int launch(int np, const char *mpiexec) {
    char nbuf[16];
    snprintf(nbuf, sizeof nbuf, "%d", np);
    char self[4096];
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    if (len <= 0) return 1;
    self[len] = 0;
    const char *argv[16];
    int k = 0;
    argv[k++] = mpiexec;
    if (geteuid() == 0) argv[k++] = "--allow-run-as-root";
    argv[k++] = "--oversubscribe";
    argv[k++] = "--bind-to";
    argv[k++] = "none";
    argv[k++] = "--mca";
    argv[k++] = "btl";
    argv[k++] = "self,vader";
    argv[k++] = "-n";
    argv[k++] = nbuf;
    argv[k++] = self;
    argv[k] = NULL;
    setenv("OMPI_MCA_btl_vader_single_copy_mechanism", "none", 0);
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        execvp(mpiexec, (char *const *)argv);
        fprintf(stderr, "cannot run %s: %s\n", mpiexec, strerror(errno));
        _exit(127);
    }
    if (pid < 0) return 1;
    double t0 = ts_time_now();
    int status = 0;
    for (;;) {
        pid_t p = waitpid(pid, &status, WNOHANG);
        if (p == pid) break;
        if (ts_time_now() - t0 > 300) {
            fprintf(stderr, "mpirun -n %d still running after 300 s: killing it\n", np);
            kill(pid, SIGTERM);
            usleep(2000 * 1000);
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            return 1;
        }
        usleep(10 * 1000);
    }
    if (WIFEXITED(status) && WEXITSTATUS(status) == 127) {
        printf("skip: could not run %s\n", mpiexec);
        return 77;
    }
    printf("mpirun -n %d: %s %d (%.1f s)\n", np, WIFEXITED(status) ? "exit status" : "signal",
           WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status), ts_time_now() - t0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}

int main(int argc, char **argv) {
    int np = 0;
    const char *mpiexec = "mpirun";
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--np") == 0 && i + 1 < argc) np = atoi(argv[++i]);
        else if (strcmp(argv[i], "--mpiexec") == 0 && i + 1 < argc) mpiexec = argv[++i];
        else {
            fprintf(stderr, "usage: %s [--np N [--mpiexec PATH]]\n", argv[0]);
            return 2;
        }
    }
    if (np > 0 && !getenv("OMPI_COMM_WORLD_SIZE")) return launch(np, mpiexec);

    const char *r = getenv("OMPI_COMM_WORLD_RANK"), *w = getenv("OMPI_COMM_WORLD_SIZE");
    g_rank = r ? atoi(r) : 0;
    g_world = w ? atoi(w) : 1;
    const tu_test tests[] = {T(test_collectives),      T(test_pieces),  T(test_aliasing),
                             T(test_p2p_mismatch),     T(test_timeout), T(test_abort),
                             T(test_work_timeout),     T(test_checked_mismatch), T(test_rank_mismatch),
                             T(test_heartbeat),        T(test_init_timeout)};
    int failed = 0;
    for (size_t i = 0; i < TS_ARRAY_LEN(tests); i++) {
        int before = tu_failures;
        double t0 = ts_time_now();
        tests[i].fn();
        bool bad = tu_failures != before;
        failed += bad;
        if (bad || g_rank == 0)
            fprintf(stderr, "[%s] rank %d/%d %s (%.2fs)\n", bad ? "FAIL" : " ok ", g_rank, g_world, tests[i].name,
                    ts_time_now() - t0);
    }
    printf("rank %d/%d: %d checks, %d failed tests\n", g_rank, g_world, tu_checks, failed);
    fflush(NULL);
    return failed ? 1 : 0;
}
#endif /* TS_HAVE_MPI */
