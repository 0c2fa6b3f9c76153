/*
 * tests/test_shm.c — the built-in backend's shared-memory transport under
 * pressure: segments live in TS_SHM_DIR (a private folder per test here), are
 * reserved up front, fall back to TCP for the pairs of a rank that cannot
 * reserve its segment (no folder, a file size limit standing in for a full
 * tmpfs), shrink their rings to what the folder holds, and never outlive a
 * SIGTERM or SIGINT — also when the application has its own handler — or,
 * after a SIGKILL, the next group's setup. tests/cli_shm.sh runs 16 ranks on a
 * small tmpfs where the system allows a private mount.
 */
#include "test_util.h"
#include "rank_threads.h"

#include "distributed/builtin/transport.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

/* ---- captured log lines ------------------------------------------------------------------------------ */
static pthread_mutex_t log_mu = PTHREAD_MUTEX_INITIALIZER;
static char log_buf[16384];

static void capture(ts_log_level level, const char *msg, void *user) {
    (void)level;
    (void)user;
    pthread_mutex_lock(&log_mu);
    size_t n = strlen(log_buf);
    snprintf(log_buf + n, sizeof log_buf - n, "%s\n", msg);
    pthread_mutex_unlock(&log_mu);
}

static int log_count(const char *needle) {
    int c = 0;
    for (const char *p = log_buf; (p = strstr(p, needle)); p++) c++;
    return c;
}

static void log_start(ts_log_level level) {
    log_buf[0] = 0;
    ts_log_set_level(level);
    ts_log_set_sink(capture, NULL);
}

static void log_stop(void) {
    ts_log_set_sink(NULL, NULL);
    ts_log_set_level(TS_LOG_WARN);
}

/* Files in dir whose name starts with "tessera-". */
static int segments_in(const char *dir) {
    DIR *d = opendir(dir);
    int n = 0;
    for (struct dirent *e; d && (e = readdir(d));) n += strncmp(e->d_name, "tessera-", 8) == 0;
    if (d) closedir(d);
    return n;
}

static const char *subdir(const char *name) {
    static char bufs[4][400];
    static int k;
    char *b = bufs[k++ % 4];
    snprintf(b, sizeof bufs[0], "%s/%s", tu_tmpdir(), name);
    mkdir(b, 0700);
    return b;
}

/* ---- ranks as threads: every collective still adds up ------------------------------------------------ */
typedef struct rank_ctx rank_ctx;
struct rank_ctx {
    TU_RANK_FIELDS(rank_ctx);
    int bad;
};
TU_RANK_THREADS(rank_ctx, run_ranks)

#define N_ELEMS ((1 << 20) + 3) /* the ring path, several chunks */

static ts_status all_reduce_body(rank_ctx *c, ts_process_group *pg) {
    ts_tensor *t = NULL;
    int64_t n = N_ELEMS;
    ts_status st = ts_tensor_empty(NULL, TS_F32, 1, &n, &t);
    if (st != TS_OK) return st;
    float *p = ts_tensor_data_f32(t);
    for (int round = 0; round < 2 && st == TS_OK; round++) {
        for (int64_t i = 0; i < n; i++) p[i] = (float)((i % 7) + c->rank);
        st = ts_all_reduce(pg, t, TS_REDUCE_SUM, NULL);
        int w = c->world;
        for (int64_t i = 0; st == TS_OK && i < n && !c->bad; i++)
            c->bad += p[i] != (float)(w * (i % 7) + w * (w - 1) / 2);
    }
    ts_tensor_release(t);
    return st;
}

static bool ranks_ok(rank_ctx *c, int world) {
    bool ok = run_ranks(world, all_reduce_body, NULL, c);
    for (int r = 0; r < world; r++) ok &= c[r].bad == 0;
    return ok;
}

/* Segments go to TS_SHM_DIR, and are gone once every peer mapped them. */
static void test_segment_dir(void) {
    const char *dir = subdir("segs");
    setenv("TS_SHM_DIR", dir, 1);
    log_start(TS_LOG_DEBUG);
    rank_ctx c[3];
    CHECK(ranks_ok(c, 3));
    log_stop();
    CHECK(log_count("reserved") == 3);
    CHECK(log_count(dir) >= 3);
    CHECK(segments_in(dir) == 0);
    unsetenv("TS_SHM_DIR");
}

/* No segment can be made: every pair uses TCP, with a warning per rank, and the results are exact. */
static void test_fallback_no_dir(void) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/does/not/exist", tu_tmpdir());
    setenv("TS_SHM_DIR", dir, 1);
    log_start(TS_LOG_WARN);
    rank_ctx c[3];
    CHECK(ranks_ok(c, 3));
    log_stop();
    CHECK(log_count("cannot create") == 3);
    CHECK(log_count("talks to its 2 peers on this host over TCP") == 3);
    unsetenv("TS_SHM_DIR");
}

/* The folder is too small for the requested rings: they shrink until the host's ranks fit in 90% of
 * its free space (a warning names both sizes), not below 64 KiB. (tests/cli_shm.sh runs it for real on
 * a small tmpfs.) */
static void test_rings_shrink_to_fit(void) {
    const char *dir = subdir("shrink");
    setenv("TS_SHM_DIR", dir, 1);
    struct statvfs vf;
    CHECK(statvfs(dir, &vf) == 0);
    double avail = (double)vf.f_bavail * (double)vf.f_frsize * 0.9;
    log_start(TS_LOG_WARN);
    size_t want = (size_t)1 << 46, ring = ts__shm_pick_ring(16, want); /* 64 TiB rings */
    log_stop();
    CHECK(ring < want && ring >= (64u << 10) && ring % 4096 == 0);
    CHECK(16.0 * (double)ts__shm_seg_bytes(16, ring) <= avail);
    CHECK(16.0 * (double)ts__shm_seg_bytes(16, 2 * ring) > avail);
    CHECK(log_count("MiB free, 16 ranks on this host need") == 1);
    log_start(TS_LOG_WARN); /* what fits is left alone, silently */
    CHECK(ts__shm_pick_ring(2, 1u << 20) == 1u << 20);
    CHECK(ts__shm_pick_ring(2, 1000) == 64u << 10);
    log_stop();
    CHECK(log_buf[0] == 0);
    unsetenv("TS_SHM_DIR");
}

/* ---- ranks as processes ---------------------------------------------------------------------------------- */
typedef enum { MODE_FSIZE, MODE_STOP, MODE_STOP_OWN_HANDLER } proc_mode;

static volatile sig_atomic_t own_handler_ran;
static void own_handler(int sig) {
    (void)sig;
    own_handler_ran = 1;
    _exit(42); /* an application that exits its own way on SIGTERM */
}

static void stop_after_reserving(ts_log_level level, const char *msg, void *user) {
    (void)level;
    (void)user;
    if (strstr(msg, "reserved")) raise(SIGSTOP); /* the segment exists, its name is not published yet */
}

/* Rank `rank` of `world` in a forked child, over the parent's TCP store. */
static int child_rank(int port, int rank, int world, proc_mode mode) {
    if (mode == MODE_FSIZE && rank == 1) { /* a full tmpfs: reserving the segment fails (EFBIG) */
        signal(SIGXFSZ, SIG_IGN);
        struct rlimit lim = {16384, 16384};
        setrlimit(RLIMIT_FSIZE, &lim);
    }
    if (mode != MODE_FSIZE && rank == world - 1) {
        ts_log_set_level(TS_LOG_DEBUG);
        ts_log_set_sink(stop_after_reserving, NULL);
    }
    if (mode == MODE_STOP_OWN_HANDLER) signal(SIGTERM, own_handler);
    if (mode == MODE_FSIZE) log_start(TS_LOG_WARN);
    ts_store *s = NULL;
    ts_process_group *pg = NULL;
    if (ts_store_tcp_new("127.0.0.1", port, false, 30.0, &s) != TS_OK) return 10;
    ts_pg_options o = TS_PG_OPTIONS_INIT;
    o.store = s;
    o.rank = rank;
    o.world_size = world;
    o.group_name = "shm";
    o.timeout_s = 30;
    if (ts_pg_new(&o, &pg) != TS_OK) {
        fprintf(stderr, "rank %d: %s\n", rank, ts_last_error());
        return 11;
    }
    rank_ctx c = {0};
    c.rank = rank;
    c.world = world;
    ts_status st = all_reduce_body(&c, pg);
    ts_pg_free(pg);
    ts_store_release(s);
    if (st != TS_OK) fprintf(stderr, "rank %d: %s\n", rank, ts_last_error());
    int rc = st != TS_OK ? 12 : c.bad ? 13 : 0;
    if (mode == MODE_FSIZE && rank == 1 && !log_count("cannot reserve")) rc = 14;
    if (mode == MODE_FSIZE && rank != 1 && log_count("cannot reserve")) rc = 15;
    return rc;
}

static void fork_ranks(int world, proc_mode mode, ts_store **server, pid_t *pids) {
    CHECK_OK(ts_store_tcp_new("127.0.0.1", 0, true, 30.0, server));
    int port = ts_store_tcp_port(*server);
    fflush(NULL);
    for (int r = 0; r < world; r++) {
        pids[r] = fork();
        if (pids[r] == 0) _exit(child_rank(port, r, world, mode));
    }
}

/* waitpid with a deadline; SIGKILLs the rest when it passes. Returns the statuses in st. */
static void wait_ranks(int world, pid_t *pids, int *st, double timeout) {
    double t0 = ts_time_now();
    for (int r = 0; r < world; r++) {
        while (waitpid(pids[r], &st[r], WNOHANG) == 0) {
            if (ts_time_now() - t0 > timeout) {
                fprintf(stderr, "rank %d still running after %g s: killed\n", r, timeout);
                for (int k = 0; k < world; k++) kill(pids[k], SIGKILL);
                tu_failures++;
            }
            usleep(2000);
        }
    }
}

/* One rank cannot reserve its segment (a file size limit): its pairs use TCP, the others keep shared
 * memory, and every result is exact. */
static void test_fallback_one_rank(void) {
    setenv("TS_SHM_DIR", subdir("fsize"), 1);
    ts_store *server = NULL;
    pid_t pids[3];
    int st[3];
    fork_ranks(3, MODE_FSIZE, &server, pids);
    wait_ranks(3, pids, st, 60);
    for (int r = 0; r < 3; r++) {
        CHECK(WIFEXITED(st[r]) && WEXITSTATUS(st[r]) == 0);
        if (!WIFEXITED(st[r]) || WEXITSTATUS(st[r]))
            fprintf(stderr, "  rank %d: %s %d\n", r, WIFEXITED(st[r]) ? "exit" : "signal",
                    WIFEXITED(st[r]) ? WEXITSTATUS(st[r]) : WTERMSIG(st[r]));
    }
    CHECK(segments_in(getenv("TS_SHM_DIR")) == 0);
    ts_store_release(server);
    unsetenv("TS_SHM_DIR");
}

/* Ranks terminated by a signal while their segments exist (the last rank stops itself right after
 * reserving its own, so the others wait for it) remove them: nothing is left in the folder. */
static void signal_case(proc_mode mode, int sig, const char *name) {
    const char *dir = subdir(name);
    setenv("TS_SHM_DIR", dir, 1);
    const int world = 4;
    ts_store *server = NULL;
    pid_t pids[4];
    int st[4];
    fork_ranks(world, mode, &server, pids);
    double t0 = ts_time_now();
    while (segments_in(dir) < world && ts_time_now() - t0 < 30) usleep(1000);
    int seen = segments_in(dir);
    CHECK(seen == world);
    usleep(20000);
    for (int r = 0; r < world; r++) kill(pids[r], sig);
    kill(pids[world - 1], SIGCONT); /* the stopped one takes its signal now */
    wait_ranks(world, pids, st, 30);
    for (int r = 0; r < world; r++) {
        if (mode == MODE_STOP_OWN_HANDLER && sig == SIGTERM)
            CHECK(WIFEXITED(st[r]) && WEXITSTATUS(st[r]) == 42); /* the application's handler ran after ours */
        else
            CHECK(WIFSIGNALED(st[r]) && WTERMSIG(st[r]) == sig); /* then died of it, as without us */
    }
    int left = segments_in(dir);
    fprintf(stderr, "  %s: %d segments before the signal, %d after\n", name, seen, left);
    CHECK(left == 0);
    ts_store_release(server);
    unsetenv("TS_SHM_DIR");
}

static void test_sigterm_leaves_nothing(void) {
    signal_case(MODE_STOP, SIGTERM, "sigterm");
    signal_case(MODE_STOP, SIGINT, "sigint");
    signal_case(MODE_STOP_OWN_HANDLER, SIGTERM, "own_handler");
}

/* Segments of processes killed with SIGKILL are removed by the next setup once they are 30 s old;
 * a live process's segment and a fresh one stay. */
static void test_stale_segments_swept(void) {
    const char *dir = subdir("stale");
    setenv("TS_SHM_DIR", dir, 1);
    fflush(NULL);
    pid_t dead = fork();
    if (dead == 0) _exit(0);
    waitpid(dead, NULL, 0);
    char old_dead[600], new_dead[600], old_live[600];
    snprintf(old_dead, sizeof old_dead, "%s/tessera-%d-0-0-1", dir, (int)dead);
    snprintf(new_dead, sizeof new_dead, "%s/tessera-%d-1-0-1", dir, (int)dead);
    snprintf(old_live, sizeof old_live, "%s/tessera-%d-0-0-1", dir, (int)getppid());
    const char *files[3] = {old_dead, new_dead, old_live};
    for (int i = 0; i < 3; i++) {
        int fd = open(files[i], O_CREAT | O_WRONLY, 0600);
        CHECK(fd >= 0);
        if (fd >= 0) close(fd);
    }
    struct timespec t[2] = {{time(NULL) - 3600, 0}, {time(NULL) - 3600, 0}};
    CHECK(utimensat(AT_FDCWD, old_dead, t, 0) == 0);
    CHECK(utimensat(AT_FDCWD, old_live, t, 0) == 0);
    rank_ctx c[2];
    CHECK(ranks_ok(c, 2));
    struct stat sb;
    CHECK(stat(old_dead, &sb) != 0);
    CHECK(stat(new_dead, &sb) == 0);
    CHECK(stat(old_live, &sb) == 0);
    unlink(new_dead);
    unlink(old_live);
    unsetenv("TS_SHM_DIR");
}

int main(int argc, char **argv) {
    static const tu_test tests[] = {T(test_segment_dir),       T(test_fallback_no_dir),
                                    T(test_rings_shrink_to_fit), T(test_fallback_one_rank),
                                    T(test_sigterm_leaves_nothing), T(test_stale_segments_swept)};
    int rc = tu_run(tests, (int)(sizeof tests / sizeof tests[0]), argc, argv);
    tu_rm_tmpdir();
    return rc;
}
