/*
 * tests/test_liveness.c — heartbeats and the flight recorder.
 *
 * Ranks as threads (tests/rank_threads.h) cannot be stopped, so a rank
 * "stops" by pausing its heartbeat thread (ts__pg_heartbeat_pause) and not
 * calling the collective its peers wait in: the peers must fail within the
 * heartbeat timeout (1.5 s here; the collective timeout is 60 s) with
 * TS_ERR_TIMEOUT naming the silent rank, its host and pid and the collective,
 * write their failure report (TS_RUN_DIR) and flight recorder file
 * (TS_FLIGHT_RECORDER_DIR), and keep the operations in their recorder. A rank
 * that sleeps or computes for twice the heartbeat timeout between collectives
 * must not be failed. Real processes: a forked rank SIGSTOPs itself (shared
 * memory and TCP), and the others fail naming it.
 */
#include "test_util.h"

#include "core/internal.h"
#include "distributed/pg.h"

#include <dirent.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "rank_threads.h"
#include "store_server.h"

#define HB_TIMEOUT "1.5"
#define HB_TIMEOUT_S 1.5
#define WARMUP 5 /* collectives before a rank goes silent */

typedef struct rank_ctx rank_ctx;
struct rank_ctx {
    TU_RANK_FIELDS(rank_ctx);
    ts_status fail_st;   /* the status of the collective that was expected to fail */
    char fail_msg[1024]; /* its message */
    double fail_s;       /* seconds it took */
    ts_pg_op_record rec[TS_PG_FLIGHT_RECORDER_SIZE];
    int nrec;
    double hb_timeout;
};
TU_RANK_THREADS(rank_ctx, run_ranks)

static atomic_int g_released; /* the silent rank may go on */

static ts_status warm_up(ts_process_group *pg, ts_tensor *t) {
    for (int i = 0; i < WARMUP; i++) TS_TRY(ts_all_reduce(pg, t, TS_REDUCE_SUM, NULL));
    return TS_OK;
}

static ts_status new_vec(int64_t n, ts_tensor **t) {
    TS_TRY(ts_tensor_empty(ts_device_cpu(), TS_F32, 1, &n, t));
    memset(ts_tensor_data(*t), 0, (size_t)n * sizeof(float));
    return TS_OK;
}

/* Rank 1 pauses its heartbeat and stays away; the others call all_reduce #WARMUP+1. */
static ts_status body_silent(rank_ctx *c, ts_process_group *pg) {
    ts_tensor *t = NULL;
    TS_TRY(new_vec(1000, &t));
    ts_status st = warm_up(pg, t);
    c->hb_timeout = ts_pg_heartbeat_timeout(pg);
    if (st == TS_OK && c->rank == 1) {
        usleep(500 * 1000); /* a few heartbeats tell the others that collective #WARMUP is done */
        ts__pg_heartbeat_pause(pg, true);
        for (int i = 0; i < 2000 && !atomic_load(&g_released); i++) usleep(5000); /* at most 10 s */
        ts__pg_heartbeat_pause(pg, false);
        /* the others have given up on this group (its outcome here depends on what they had sent) */
        ts_all_reduce(pg, t, TS_REDUCE_SUM, NULL);
    } else if (st == TS_OK) {
        double t0 = ts_time_now();
        c->fail_st = ts_all_reduce(pg, t, TS_REDUCE_SUM, NULL);
        c->fail_s = ts_time_now() - t0;
        snprintf(c->fail_msg, sizeof c->fail_msg, "%s", ts_last_error());
        /* later calls fail fast */
        ts_status again = ts_barrier(pg, NULL);
        if (again == TS_OK) c->fail_st = TS_OK; /* flagged by the checks */
        TS_TRY(ts_pg_flight_recorder(pg, c->rec, TS_PG_FLIGHT_RECORDER_SIZE, &c->nrec));
        if (c->rank == 0) atomic_store(&g_released, 1);
    }
    ts_tensor_release(t);
    return st;
}

static bool file_has(const char *path, const char *needle) {
    FILE *f = fopen(path, "r");
    if (!f) return false;
    char buf[8192];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    return strstr(buf, needle) != NULL;
}

static void rm_dir(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    char path[1200];
    while ((e = readdir(d)))
        if (e->d_name[0] != '.') {
            snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
            unlink(path);
        }
    closedir(d);
    rmdir(dir);
}

static void check_silent(int world) {
    char dir[] = "/tmp/ts_liveness_XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    setenv("TS_RUN_DIR", dir, 1);
    setenv("TS_FLIGHT_RECORDER_DIR", dir, 1);
    atomic_store(&g_released, 0);
    rank_ctx c[4];
    CHECK(run_ranks(world, body_silent, NULL, c));
    unsetenv("TS_RUN_DIR");
    unsetenv("TS_FLIGHT_RECORDER_DIR");
    char host[256] = "";
    gethostname(host, sizeof host - 1);
    char pid[32];
    snprintf(pid, sizeof pid, "pid %d", (int)getpid());
    for (int r = 0; r < world; r++) {
        CHECK_NEAR(c[r].hb_timeout, HB_TIMEOUT_S, 0);
        if (r == 1) continue;
        /* the first to notice says TIMEOUT; a peer may learn it from that rank's abort first (REMOTE) */
        CHECK(c[r].fail_st == TS_ERR_TIMEOUT || c[r].fail_st == TS_ERR_REMOTE);
        const char *m = c[r].fail_msg;
        CHECK(strstr(m, "rank 1 (host ") && strstr(m, host) && strstr(m, pid));
        CHECK(strstr(m, "has not been heard from for") && strstr(m, "stopped or hung: its host answers"));
        if (c[r].fail_st == TS_ERR_TIMEOUT) {
            char want[96];
            snprintf(want, sizeof want, "waiting in collective #%d all_reduce", WARMUP + 1);
            CHECK(strstr(m, want) != NULL);
            CHECK(strstr(m, "float32 x 1000") != NULL);
        }
        if (!strstr(m, "rank 1 (host ")) fprintf(stderr, "rank %d: %s\n", r, m);
        /* rank 1 went silent 0.5 s after the call; then within the heartbeat timeout plus a margin,
         * long before the collective timeout (60 s) */
        CHECK(c[r].fail_s > HB_TIMEOUT_S && c[r].fail_s < 0.5 + HB_TIMEOUT_S + 3.0);
        /* the flight recorder: the group's setup, the warm-up, completed, then the failed call; the
         * barrier after the abort was refused without being recorded */
        CHECK(c[r].nrec == WARMUP + 2);
        CHECK(c[r].nrec && c[r].rec[0].kind == TS_COLL_INIT && c[r].rec[0].seq == 0);
        CHECK(c[r].nrec && c[r].rec[0].state == TS_PG_OP_COMPLETED);
        for (int i = 0; i < c[r].nrec - 1 && i <= WARMUP; i++) {
            const ts_pg_op_record *e = &c[r].rec[i + 1];
            CHECK(e->seq == (uint64_t)i + 1 && e->kind == TS_COLL_ALL_REDUCE);
            CHECK(e->dtype == TS_F32 && e->count == 1000 && e->bytes == 4000 && e->reduce_op == TS_REDUCE_SUM);
            CHECK(e->peer == -1 && !e->async);
            CHECK(e->state == (i < WARMUP ? TS_PG_OP_COMPLETED : TS_PG_OP_FAILED));
            CHECK(e->issued_s > 0 && e->issued_s <= e->started_s && e->started_s <= e->ended_s);
        }
        if (c[r].nrec == WARMUP + 2) {
            const ts_pg_op_record *e = &c[r].rec[WARMUP + 1];
            CHECK(e->ended_s - e->started_s > HB_TIMEOUT_S);
        }
    }
    /* rank 0 noticed by itself or learned it from rank 2 and vice versa; at least one blamed rank 1 itself */
    int heartbeat_reports = 0;
    for (int r = 0; r < world; r++) {
        if (r == 1) continue;
        char path[1200];
        snprintf(path, sizeof path, "%s/failure-default-rank%d.txt", dir, r);
        CHECK(file_has(path, "status=TS_ERR_"));
        if (file_has(path, "cause=heartbeat")) {
            heartbeat_reports++;
            CHECK(file_has(path, "blame_rank=1\n") && file_has(path, "op_name=all_reduce"));
            char want[64];
            snprintf(want, sizeof want, "op_seq=%d\n", WARMUP + 1);
            CHECK(file_has(path, want));
            snprintf(want, sizeof want, "blame_position=completed collective #%d", WARMUP);
            CHECK(file_has(path, want));
        }
        snprintf(path, sizeof path, "%s/flight-default-rank%d-pid%d.txt", dir, r, (int)getpid());
        char want[64];
        snprintf(want, sizeof want, "collective #%d all_reduce (float32 x 1000", WARMUP + 1);
        CHECK(file_has(path, want) && file_has(path, "collective #1 all_reduce"));
    }
    CHECK(heartbeat_reports >= 1);
    if (!getenv("TS_KEEP")) rm_dir(dir);
}

static void test_silent_rank_2(void) { check_silent(2); }
static void test_silent_rank_3(void) { check_silent(3); }

/* A rank busy for twice the heartbeat timeout between collectives (asleep, then
 * spinning on the CPU) keeps its heartbeat: its peer waits and succeeds. */
static ts_status body_busy(rank_ctx *c, ts_process_group *pg) {
    ts_tensor *t = NULL;
    TS_TRY(new_vec(100, &t));
    ts_status st = warm_up(pg, t);
    for (int round = 0; round < 2 && st == TS_OK; round++) {
        if (c->rank == 1) {
            double until = ts_time_now() + 2 * HB_TIMEOUT_S;
            if (round == 0) {
                usleep((useconds_t)(2 * HB_TIMEOUT_S * 1e6));
            } else {
                volatile double x = 0;
                while (ts_time_now() < until)
                    for (int i = 0; i < 100000; i++) x += i;
            }
        }
        st = ts_all_reduce(pg, t, TS_REDUCE_SUM, NULL);
    }
    if (st == TS_OK) st = ts_barrier(pg, NULL);
    ts_tensor_release(t);
    return st;
}

static void test_busy_rank_is_not_failed(void) {
    rank_ctx c[3];
    CHECK(run_ranks(2, body_busy, NULL, c));
    CHECK(run_ranks(3, body_busy, NULL, c));
}

/* send/recv waits on its peer only: rank 0 receives from a silent rank 1. */
static ts_status body_p2p(rank_ctx *c, ts_process_group *pg) {
    ts_tensor *t = NULL;
    TS_TRY(new_vec(10, &t));
    ts_status st = TS_OK;
    if (c->rank == 0) {
        st = ts_recv(pg, t, 1, 7); /* a completed one first */
        double t0 = ts_time_now();
        if (st == TS_OK) {
            c->fail_st = ts_recv(pg, t, 1, 7);
            c->fail_s = ts_time_now() - t0;
            snprintf(c->fail_msg, sizeof c->fail_msg, "%s", ts_last_error());
        }
        ts_pg_flight_recorder(pg, c->rec, TS_PG_FLIGHT_RECORDER_SIZE, &c->nrec);
        atomic_store(&g_released, 1);
    } else {
        st = ts_send(pg, t, 0, 7);
        ts__pg_heartbeat_pause(pg, true);
        while (!atomic_load(&g_released)) usleep(5000);
        c->fail_st = TS_ERR_TIMEOUT;
    }
    ts_tensor_release(t);
    return st;
}

static void test_silent_peer_of_recv(void) {
    atomic_store(&g_released, 0);
    rank_ctx c[2];
    CHECK(run_ranks(2, body_p2p, NULL, c));
    CHECK_STATUS(c[0].fail_st, TS_ERR_TIMEOUT);
    CHECK(strstr(c[0].fail_msg, "rank 1 (host ") && strstr(c[0].fail_msg, "waiting in p2p #2 recv (float32 x 10, 40 B, from rank 1)"));
    CHECK(c[0].fail_s < HB_TIMEOUT_S + 3.0);
    const ts_pg_op_record *e = c[0].rec + 1; /* after "init" */
    CHECK(c[0].nrec == 3 && e[0].seq == 1 && e[1].seq == 2 && e[1].peer == 1);
    CHECK(c[0].nrec == 3 && e[0].state == TS_PG_OP_COMPLETED && e[1].state == TS_PG_OP_FAILED);
}

/* The recorder keeps the last 32 operations, oldest first, numbering collectives and p2p apart. */
static ts_status body_record(rank_ctx *c, ts_process_group *pg) {
    ts_tensor *t = NULL, *g = NULL;
    TS_TRY(new_vec(6, &t));
    TS_TRY(new_vec(6 * c->world, &g));
    ts_status st = TS_OK;
    for (int i = 0; i < 40 && st == TS_OK; i++) st = ts_all_reduce(pg, t, TS_REDUCE_MAX, NULL);
    if (st == TS_OK) st = ts_broadcast(pg, t, 1, NULL);
    ts_work *w = NULL;
    if (st == TS_OK) st = ts_all_gather(pg, g, t, &w);
    if (st == TS_OK) st = ts_work_wait(w, -1);
    ts_work_free(w);
    if (st == TS_OK) st = c->rank == 0 ? ts_send(pg, t, 1, 3) : ts_recv(pg, t, 0, 3);
    if (st == TS_OK) st = ts_barrier(pg, NULL);
    if (st == TS_OK) st = ts_pg_flight_recorder(pg, c->rec, TS_PG_FLIGHT_RECORDER_SIZE, &c->nrec);
    ts_tensor_release(t);
    ts_tensor_release(g);
    return st;
}

static void test_recorder_contents(void) {
    rank_ctx c[2];
    CHECK(run_ranks(2, body_record, NULL, c));
    for (int r = 0; r < 2; r++) {
        CHECK(c[r].nrec == TS_PG_FLIGHT_RECORDER_SIZE);
        if (c[r].nrec != TS_PG_FLIGHT_RECORDER_SIZE) continue;
        const ts_pg_op_record *e = c[r].rec;
        int n = c[r].nrec;
        /* 40 all_reduce (#1..#40), broadcast #41, all_gather #42, send/recv p2p #1, barrier #43 */
        CHECK(e[0].seq == 13 && e[0].kind == TS_COLL_ALL_REDUCE && e[0].reduce_op == TS_REDUCE_MAX);
        CHECK(e[n - 5].seq == 40);
        CHECK(e[n - 4].seq == 41 && e[n - 4].kind == TS_COLL_BROADCAST && e[n - 4].peer == 1);
        CHECK(e[n - 3].seq == 42 && e[n - 3].kind == TS_COLL_ALL_GATHER && e[n - 3].async && e[n - 3].count == 6);
        CHECK(e[n - 2].seq == 1 && e[n - 2].kind == (r == 0 ? TS_COLL_SEND : TS_COLL_RECV) && e[n - 2].peer == 1 - r);
        CHECK(e[n - 1].seq == 43 && e[n - 1].kind == TS_COLL_BARRIER);
        for (int i = 0; i < n; i++) CHECK(e[i].state == TS_PG_OP_COMPLETED);
    }
    /* a short buffer gets the newest */
    ts_store *s = NULL;
    CHECK_OK(ts_store_memory_new(&s));
    ts_pg_options o = TS_PG_OPTIONS_INIT;
    o.store = s;
    o.rank = 0;
    o.world_size = 1;
    ts_process_group *pg = NULL;
    CHECK_OK(ts_pg_new(&o, &pg));
    if (pg) {
        CHECK(ts_pg_heartbeat_timeout(pg) == 0); /* a world of one has no peers to hear */
        for (int i = 0; i < 5; i++) CHECK_OK(ts_barrier(pg, NULL));
        ts_pg_op_record rec[3];
        int n = -1;
        CHECK_OK(ts_pg_flight_recorder(pg, rec, 3, &n));
        CHECK(n == 3 && rec[0].seq == 3 && rec[2].seq == 5);
        CHECK_OK(ts_pg_flight_recorder(pg, NULL, 0, &n));
        CHECK(n == 0);
        CHECK_STATUS(ts_pg_flight_recorder(NULL, rec, 3, &n), TS_ERR_INVALID_ARG);
        CHECK(strcmp(ts_pg_op_state_name(TS_PG_OP_FAILED), "failed") == 0);
        ts_pg_free(pg);
    }
    ts_store_release(s);
}

/* The kinds' names are the recorder's text (and the failure report's op_name); send/recv alone are p2p. */
static void test_coll_kind_names(void) {
    static const char *const want[TS_COLL_KIND_COUNT] = {"init",       "all_reduce", "broadcast",
                                                         "reduce",     "all_gather", "reduce_scatter",
                                                         "barrier",    "send",       "recv"};
    for (int k = 0; k < TS_COLL_KIND_COUNT; k++) {
        CHECK(strcmp(ts_coll_kind_name((ts_coll_kind)k), want[k]) == 0);
        CHECK(ts_coll_kind_is_p2p((ts_coll_kind)k) == (k == TS_COLL_SEND || k == TS_COLL_RECV));
    }
    CHECK(strcmp(ts_coll_kind_name(TS_COLL_KIND_COUNT), "?") == 0);
    CHECK(strcmp(ts_coll_kind_name((ts_coll_kind)-1), "?") == 0);
}

/* Backends are asked by capability; unknown and unbuilt names are errors listing what there is. */
static void test_backend_caps(void) {
    ts_pg_backend_caps c;
    CHECK_OK(ts_pg_backend_caps_get(NULL, &c)); /* builtin */
    CHECK(c.reduces_bf16 && !c.device_buffers && !c.joins_without_store);
    CHECK_OK(ts_pg_backend_caps_get("builtin", &c));
    CHECK(c.reduces_bf16);
    if (ts_pg_backend_available("mpi")) {
        CHECK_OK(ts_pg_backend_caps_get("mpi", &c));
        CHECK(!c.reduces_bf16 && !c.device_buffers && c.joins_without_store);
    } else {
        CHECK_STATUS(ts_pg_backend_caps_get("mpi", &c), TS_ERR_UNSUPPORTED);
        CHECK_ERR_MENTIONS("not built into this Tessera (available: builtin");
    }
    if (ts_pg_backend_available("nccl")) {
        CHECK_OK(ts_pg_backend_caps_get("nccl", &c));
        CHECK(c.reduces_bf16 && c.device_buffers && !c.joins_without_store);
    }
    CHECK_STATUS(ts_pg_backend_caps_get("gloo", &c), TS_ERR_UNSUPPORTED);
    CHECK_STATUS(ts_pg_backend_caps_get("carrier-pigeon", &c), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("unknown process group backend 'carrier-pigeon' (available: builtin");
    CHECK_STATUS(ts_pg_backend_caps_get("builtin", NULL), TS_ERR_INVALID_ARG);
}

/* Options and environment: < 0 turns heartbeats off, a bad variable is an error naming it. */
static ts_status body_nothing(rank_ctx *c, ts_process_group *pg) {
    c->hb_timeout = ts_pg_heartbeat_timeout(pg);
    return ts_barrier(pg, NULL);
}

static void test_configuration(void) {
    rank_ctx c[2];
    setenv("TS_HEARTBEAT_TIMEOUT", "off", 1);
    CHECK(run_ranks(2, body_nothing, NULL, c));
    CHECK(c[0].hb_timeout == 0 && c[1].hb_timeout == 0);
    setenv("TS_HEARTBEAT_TIMEOUT", "7", 1);
    CHECK(run_ranks(2, body_nothing, NULL, c));
    CHECK(c[0].hb_timeout == 7 && c[1].hb_timeout == 7);
    unsetenv("TS_HEARTBEAT_TIMEOUT");
    CHECK(run_ranks(2, body_nothing, NULL, c));
    CHECK(c[0].hb_timeout == TS_HEARTBEAT_DEFAULT_TIMEOUT_S);

    ts_store *s = NULL;
    CHECK_OK(ts_store_memory_new(&s));
    ts_pg_options o = TS_PG_OPTIONS_INIT;
    o.store = s;
    o.rank = 0;
    o.world_size = 1;
    ts_process_group *pg = NULL;
    setenv("TS_HEARTBEAT_TIMEOUT", "soon", 1);
    CHECK_STATUS(ts_pg_new(&o, &pg), TS_ERR_INVALID_ARG);
    CHECK(strstr(ts_last_error(), "TS_HEARTBEAT_TIMEOUT") != NULL);
    o.heartbeat_timeout_s = -1; /* the options win over the environment */
    CHECK_OK(ts_pg_new(&o, &pg));
    ts_pg_free(pg);
    /* a timeout shorter than a few heartbeat intervals would blame healthy ranks: refused, naming
     * the variable, its value and the minimum */
    o.heartbeat_timeout_s = 0;
    setenv("TS_HEARTBEAT_TIMEOUT", "0.001", 1);
    CHECK_STATUS(ts_pg_new(&o, &pg), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("TS_HEARTBEAT_TIMEOUT='0.001'");
    o.heartbeat_timeout_s = 0.1;
    CHECK_STATUS(ts_pg_new(&o, &pg), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("ts_pg_options.heartbeat_timeout_s is 0.1 s, below the minimum of 0.25 s");
    o.heartbeat_timeout_s = 0;
    setenv("TS_HEARTBEAT_INTERVAL", "1", 1); /* 3 s with 1 s beats: under 5 intervals */
    setenv("TS_HEARTBEAT_TIMEOUT", "3", 1);
    CHECK_STATUS(ts_pg_new(&o, &pg), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("TS_HEARTBEAT_TIMEOUT=3 is 3 s, below the minimum of 5 s");
    unsetenv("TS_HEARTBEAT_INTERVAL");
    setenv("TS_HEARTBEAT_TIMEOUT", "0.5", 1); /* above 5 default intervals (0.25 s) */
    o.group_name = "at-the-minimum";
    CHECK_OK(ts_pg_new(&o, &pg));
    ts_pg_free(pg);
    setenv("TS_HEARTBEAT_TIMEOUT", HB_TIMEOUT, 1);
    ts_store_release(s);
}

/* ---- real processes: a rank stops itself with SIGSTOP ------------------------------------------------------ */
/* Child rank r of world: joins through the test's TCP store, runs collectives;
 * rank `stopper` raises SIGSTOP after WARMUP of them. Exits 0 when it saw what
 * it should: the others a failure naming the stopper within the timeout. */
static int child(int port, int rank, int world, int stopper) {
    ts_store *s = NULL;
    ts_process_group *pg = NULL;
    ts_tensor *t = NULL;
    if (ts_store_tcp_new("127.0.0.1", port, false, 30, &s) != TS_OK) return 10;
    ts_pg_options o = TS_PG_OPTIONS_INIT;
    o.store = s;
    o.rank = rank;
    o.world_size = world;
    o.timeout_s = 60;
    if (ts_pg_new(&o, &pg) != TS_OK || new_vec(1 << 16, &t) != TS_OK) {
        fprintf(stderr, "child %d: %s\n", rank, ts_last_error());
        return 11;
    }
    int rc = 0;
    if (warm_up(pg, t) != TS_OK) rc = 12;
    if (rc == 0 && rank == stopper) raise(SIGSTOP); /* the parent kills us */
    double t0 = ts_time_now();
    ts_status st = rc ? TS_OK : ts_all_reduce(pg, t, TS_REDUCE_SUM, NULL);
    double dt = ts_time_now() - t0;
    char want[64];
    snprintf(want, sizeof want, "rank %d (host ", stopper);
    if (rc == 0 && (st == TS_OK || !strstr(ts_last_error(), want) || dt > HB_TIMEOUT_S + 4.0)) {
        fprintf(stderr, "child %d: %s after %.2f s: %s\n", rank, ts_status_name(st), dt, ts_last_error());
        rc = 13;
    }
    ts_tensor_release(t);
    ts_pg_free(pg);
    ts_store_release(s);
    return rc;
}

static void run_stopped(int world, int stopper, bool tcp) {
    tu_store_server server;
    if (!tu_store_server_start(&server)) return;
    if (tcp) setenv("TS_DIST_TRANSPORT", "tcp", 1);
    pid_t pids[4];
    fflush(NULL);
    for (int r = 0; r < world; r++) {
        pids[r] = fork();
        if (pids[r] == 0) _exit(child(server.port, r, world, stopper));
    }
    if (tcp) unsetenv("TS_DIST_TRANSPORT");
    double t0 = ts_time_now();
    for (int r = 0; r < world; r++) {
        if (r == stopper) continue;
        int status = 0;
        while (waitpid(pids[r], &status, WNOHANG) == 0 && ts_time_now() - t0 < 30) usleep(10000);
        if (ts_time_now() - t0 >= 30) {
            kill(pids[r], SIGKILL);
            waitpid(pids[r], &status, 0);
        }
        CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    }
    kill(pids[stopper], SIGKILL); /* works on a stopped process */
    waitpid(pids[stopper], NULL, 0);
    tu_store_server_stop(&server);
}

static void test_stopped_process(void) {
    run_stopped(2, 1, false);
    run_stopped(3, 0, false);
    run_stopped(3, 2, true);
}

int main(int argc, char **argv) {
    setenv("TS_HEARTBEAT_TIMEOUT", HB_TIMEOUT, 1);
    static const tu_test tests[] = {T(test_silent_rank_2),           T(test_silent_rank_3),
                                    T(test_busy_rank_is_not_failed), T(test_silent_peer_of_recv),
                                    T(test_recorder_contents),       T(test_configuration),
                                    T(test_stopped_process),         T(test_coll_kind_names),
                                    T(test_backend_caps)};
    return tu_run(tests, (int)(sizeof tests / sizeof tests[0]), argc, argv);
}
