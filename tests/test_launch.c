/*
 * tests/test_launch.c — the library's launcher (ts_launch_run) with this very
 * program as the ranks ("--rank MODE DIR [ARG]"), and the failure-report format:
 *  - each rank's share of the CPUs: OMP_NUM_THREADS from the launcher, the share a
 *    rank takes itself in ts_pg_new when the launcher sets nothing, an explicit
 *    OMP_NUM_THREADS or ts_set_num_threads winning, OMP_WAIT_POLICY's default;
 *  - a line printed by a rank (no fflush) reaches the launcher's output while
 *    the rank still runs;
 *  - on a terminal (a pty): '\r' redraws get the prefix again, a rank's line
 *    interrupting another's unfinished one erases and redraws it, and the ranks
 *    learn that their output ends on a terminal (ts_launch_isatty);
 *  - SIGTERM to the launcher twice (as `timeout` does): forwarded once, a rank
 *    that handles it finishes its cleanup, one that ignores it is killed after
 *    the grace period, and the outcome is told;
 *  - a failure report written and read back through distributed/report.h, also
 *    from the flight recorder's writer.
 * No timing is asserted: deadlines only turn a hang into a failure.
 */
#include "core/internal.h"
#include "distributed/flight.h"
#include "distributed/report.h"
#include "test_util.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <pty.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/stat.h>
#include <termios.h>
#include <unistd.h>

static char self_exe[4096];

/* ---- the ranks ------------------------------------------------------------------------------------ */

static bool exists(const char *dir, const char *name) {
    char p[1024];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return access(p, F_OK) == 0;
}

static void touch(const char *dir, const char *name) {
    char p[1024];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    int fd = open(p, O_WRONLY | O_CREAT, 0644);
    if (fd >= 0) close(fd);
}

/* Waits up to 60 s for dir/name. */
static bool await(const char *dir, const char *name) {
    for (int i = 0; i < 6000; i++) {
        if (exists(dir, name)) return true;
        usleep(10000);
    }
    return false;
}

static int rank_threads(const char *dir, const char *arg) {
    if (arg && strcmp(arg, "explicit5") == 0) ts_set_num_threads(5);
    ts_process_group *pg = NULL;
    if (ts_pg_new(NULL, &pg) != TS_OK) {
        fprintf(stderr, "ts_pg_new: %s\n", ts_last_error());
        return 3;
    }
    char p[1024];
    snprintf(p, sizeof p, "%s/threads.%d", dir, ts_pg_rank(pg));
    FILE *f = fopen(p, "w");
    const char *n = getenv("OMP_NUM_THREADS"), *w = getenv("OMP_WAIT_POLICY");
    if (f) fprintf(f, "%d %s %s\n", ts_get_num_threads(), n ? n : "-", w ? w : "-"), fclose(f);
    ts_status st = ts_barrier(pg, NULL);
    ts_pg_free(pg);
    return st == TS_OK ? 0 : 4;
}

static int rank_hello(const char *dir) {
    ts_process_group *pg = NULL;
    if (ts_pg_new(NULL, &pg) != TS_OK) return 3;
    printf("hello from a rank\n"); /* no fflush: stdout is a pipe */
    bool go = await(dir, "go");
    ts_pg_free(pg);
    return go ? 0 : 5;
}

static int rank_bar(const char *dir, int rank) {
    if (rank == 0) {
        fprintf(stderr, "\rbar 1\033[K");
        fprintf(stderr, "\rbar 2\033[K");
        touch(dir, "barred");
        if (!await(dir, "printed")) return 5;
        fprintf(stderr, "\rdone\033[K\n");
        printf("tty=%d\n", ts_launch_isatty(STDERR_FILENO));
        fflush(stdout);
    } else {
        if (!await(dir, "barred")) return 5;
        printf("line from 1\n");
        fflush(stdout);
        touch(dir, "printed");
    }
    return 0;
}

static volatile sig_atomic_t got_term;
static void on_term(int sig) { got_term = sig; }

static int rank_term(const char *dir, int rank) {
    char ready[32];
    snprintf(ready, sizeof ready, "ready.%d", rank);
    if (rank == 0) signal(SIGTERM, on_term);
    else signal(SIGTERM, SIG_IGN);
    touch(dir, ready);
    for (int i = 0; i < 6000 && !(rank == 0 && got_term); i++) usleep(10000);
    if (!got_term) return rank == 0 ? 5 : 0;
    usleep(500 * 1000); /* a cleanup that takes a while: a second SIGTERM must not cut it short */
    printf("cleaned up\n");
    fflush(stdout);
    return 0;
}

static int rank_main(const char *mode, const char *dir, const char *arg) {
    const char *r = getenv("RANK");
    int rank = r ? atoi(r) : -1;
    if (strcmp(mode, "threads") == 0) return rank_threads(dir, arg);
    if (strcmp(mode, "hello") == 0) return rank_hello(dir);
    if (strcmp(mode, "bar") == 0) return rank_bar(dir, rank);
    if (strcmp(mode, "term") == 0) return rank_term(dir, rank);
    return 2;
}

/* ---- the launcher's side -------------------------------------------------------------------------- */

/* Everything written to a pipe, read on a thread. */
typedef struct capture {
    int rd, wr;
    pthread_t th;
    pthread_mutex_t mu;
    char buf[1 << 16];
    size_t len;
    const char *watch; /* when this appears: touch watch_dir/watch_file */
    const char *watch_dir, *watch_file;
    bool watch_seen;
} capture;

static void *capture_main(void *arg) {
    capture *c = arg;
    char b[4096];
    ssize_t n;
    while ((n = read(c->rd, b, sizeof b)) > 0 || (n < 0 && errno == EINTR)) {
        if (n <= 0) continue;
        pthread_mutex_lock(&c->mu);
        size_t k = TS_MIN((size_t)n, sizeof c->buf - 1 - c->len);
        memcpy(c->buf + c->len, b, k);
        c->len += k;
        c->buf[c->len] = 0;
        if (c->watch && !c->watch_seen && strstr(c->buf, c->watch)) {
            c->watch_seen = true;
            touch(c->watch_dir, c->watch_file);
        }
        pthread_mutex_unlock(&c->mu);
    }
    return NULL;
}

static void capture_start(capture *c) {
    int p[2];
    if (pipe2(p, O_CLOEXEC) != 0) abort();
    c->rd = p[0];
    c->wr = p[1];
    pthread_mutex_init(&c->mu, NULL);
    pthread_create(&c->th, NULL, capture_main, c);
}

static void capture_stop(capture *c) {
    close(c->wr);
    pthread_join(c->th, NULL);
    close(c->rd);
    pthread_mutex_destroy(&c->mu);
}

typedef struct events {
    _Atomic int count[16];
    char text[8192];
} events;

static void on_event(const ts_launch_event *ev, void *user) {
    events *e = user;
    if ((int)ev->kind >= 0 && ev->kind < 16) atomic_fetch_add(&e->count[ev->kind], 1);
    size_t n = strlen(e->text);
    snprintf(e->text + n, sizeof e->text - n, "%s\n", ev->text);
}

static ts_status launch(int nproc, const char *mode, const char *dir, const char *arg, int threads, int out_fd,
                        events *ev, ts_launch_result *res) {
    char *argv[] = {self_exe, "--rank", (char *)mode, (char *)dir, (char *)arg, NULL};
    ts_launch_opts o = TS_LAUNCH_OPTS_INIT;
    o.nproc = nproc;
    o.threads_per_rank = threads;
    o.grace_s = 2;
    o.out_fd = o.err_fd = out_fd;
    o.on_event = on_event;
    o.user = ev;
    return ts_launch_run(&o, argv, res);
}

static char *subdir(const char *name) {
    static char p[512];
    snprintf(p, sizeof p, "%s/%s", tu_tmpdir(), name);
    mkdir(p, 0755);
    return p;
}

/* Each rank's "threads OMP_NUM_THREADS OMP_WAIT_POLICY" line. */
static void check_threads(const char *dir, int nproc, int want, const char *want_env, const char *want_policy) {
    for (int r = 0; r < nproc; r++) {
        char p[1024], n[64] = "", w[64] = "";
        int t = -1;
        snprintf(p, sizeof p, "%s/threads.%d", dir, r);
        FILE *f = fopen(p, "r");
        CHECK(f != NULL);
        if (!f) continue;
        CHECK(fscanf(f, "%d %63s %63s", &t, n, w) == 3);
        fclose(f);
        if (t != want || strcmp(n, want_env) != 0 || strcmp(w, want_policy) != 0)
            fprintf(stderr, "rank %d: %d threads, OMP_NUM_THREADS=%s, OMP_WAIT_POLICY=%s; expected %d %s %s\n", r, t,
                    n, w, want, want_env, want_policy);
        CHECK(t == want);
        CHECK(strcmp(n, want_env) == 0);
        CHECK(strcmp(w, want_policy) == 0);
    }
}

static void test_thread_share(void) {
    unsetenv("OMP_NUM_THREADS");
    unsetenv("OMP_WAIT_POLICY");
    const int share = TS_MAX(1, ts__cpu_count() / 2);
    char share_s[16];
    snprintf(share_s, sizeof share_s, "%d", share);
    events ev = {0};
    ts_launch_result res;
    /* the launcher's default: OMP_NUM_THREADS = CPUs / ranks, passive waiting */
    char *d = subdir("share");
    CHECK_OK(launch(2, "threads", d, "-", 0, STDERR_FILENO, &ev, &res));
    CHECK(res.status == 0 && res.signal == 0 && res.attempts == 1);
    check_threads(d, 2, share, share_s, "passive");
    /* the launcher leaves the environment alone: the rank takes its share in ts_pg_new */
    d = subdir("library");
    CHECK_OK(launch(2, "threads", d, "-", -1, STDERR_FILENO, &ev, &res));
    CHECK(res.status == 0);
    check_threads(d, 2, share, "-", "passive");
    /* the program's own count wins over the share */
    d = subdir("explicit");
    CHECK_OK(launch(2, "threads", d, "explicit5", -1, STDERR_FILENO, &ev, &res));
    check_threads(d, 2, 5, "-", "passive");
    /* so do OMP_NUM_THREADS and OMP_WAIT_POLICY set by the user */
    setenv("OMP_NUM_THREADS", "3", 1);
    setenv("OMP_WAIT_POLICY", "active", 1);
    d = subdir("env");
    CHECK_OK(launch(2, "threads", d, "-", 0, STDERR_FILENO, &ev, &res));
    check_threads(d, 2, 3, "3", "active");
    /* and threads_per_rank over both */
    d = subdir("option");
    CHECK_OK(launch(2, "threads", d, "-", 2, STDERR_FILENO, &ev, &res));
    check_threads(d, 2, 2, "2", "active");
    unsetenv("OMP_NUM_THREADS");
    unsetenv("OMP_WAIT_POLICY");
    ts_threads_env_defaults();
    CHECK(getenv("OMP_WAIT_POLICY") && strcmp(getenv("OMP_WAIT_POLICY"), "passive") == 0);
    unsetenv("OMP_WAIT_POLICY");
}

/* The rank prints a line and waits until the launcher's output shows it. */
static void test_line_by_line(void) {
    char *d = subdir("hello");
    static capture c;
    c.watch = "[rank 0] hello from a rank\n";
    c.watch_dir = d;
    c.watch_file = "go";
    capture_start(&c);
    events ev = {0};
    ts_launch_result res;
    CHECK_OK(launch(1, "hello", d, "-", 0, c.wr, &ev, &res));
    capture_stop(&c);
    CHECK(c.watch_seen);
    CHECK(res.status == 0); /* 5: it never saw "go", so its line was not out while it ran */
    if (!c.watch_seen || res.status) fprintf(stderr, "output: %s\nevents: %s\n", c.buf, ev.text);
}

static void test_terminal_redraw(void) {
    int master = -1, slave = -1;
    if (openpty(&master, &slave, NULL, NULL, NULL) != 0) {
        fprintf(stderr, "skip test_terminal_redraw: openpty: %s\n", strerror(errno));
        return;
    }
    struct termios t;
    tcgetattr(slave, &t);
    cfmakeraw(&t); /* bytes as written: no "\n" -> "\r\n" */
    tcsetattr(slave, TCSANOW, &t);
    char *d = subdir("bar");
    events ev = {0};
    ts_launch_result res;
    CHECK_OK(launch(2, "bar", d, "-", 0, slave, &ev, &res)); /* well under the pty's buffer */
    CHECK(res.status == 0);
    close(slave);
    char out[8192];
    size_t len = 0;
    ssize_t n;
    while (len < sizeof out - 1 && (n = read(master, out + len, sizeof out - 1 - len)) > 0) len += (size_t)n;
    out[len] = 0;
    close(master);
    /* a redraw: the prefix again after '\r' */
    CHECK(strstr(out, "[rank 0] \r[rank 0] bar 1\033[K\r[rank 0] bar 2\033[K") != NULL);
    /* rank 1's line erases rank 0's unfinished one, which is drawn again after it */
    CHECK(strstr(out, "bar 2\033[K\r\033[K[rank 1] line from 1\n[rank 0] bar 2\033[K\r[rank 0] done\033[K\n") != NULL);
    CHECK(strstr(out, "[rank 0] tty=1\n") != NULL);
    if (!strstr(out, "[rank 0] tty=1\n") || !strstr(out, "[rank 1] line from 1\n")) fprintf(stderr, "pty: %s\n", out);
}

typedef struct term_sender {
    const char *dir;
    events *ev;
    bool sent;
} term_sender;

/* SIGTERM twice, as `timeout` sends it (to the process, then its group); the second once the first was
 * handled, so that the two are not merged into one pending signal. */
static void *send_terms(void *arg) {
    term_sender *s = arg;
    if (!await(s->dir, "ready.0") || !await(s->dir, "ready.1")) return NULL;
    kill(getpid(), SIGTERM);
    for (int i = 0; i < 6000 && !atomic_load(&s->ev->count[TS_LAUNCH_EV_SIGNAL]); i++) usleep(10000);
    kill(getpid(), SIGTERM);
    s->sent = true;
    return NULL;
}

static void test_sigterm_grace(void) {
    char *d = subdir("term");
    static capture c;
    capture_start(&c);
    static events ev;
    term_sender s = {d, &ev, false};
    pthread_t th;
    pthread_create(&th, NULL, send_terms, &s);
    ts_launch_result res;
    CHECK_OK(launch(2, "term", d, "-", 0, c.wr, &ev, &res));
    pthread_join(th, NULL);
    capture_stop(&c);
    CHECK(s.sent);
    CHECK(res.signal == SIGTERM && res.status == 128 + SIGTERM);
    CHECK(ev.count[TS_LAUNCH_EV_SIGNAL] == 1);      /* the second SIGTERM is the first one again */
    CHECK(ev.count[TS_LAUNCH_EV_SIGNAL_KILL] == 0);
    CHECK(ev.count[TS_LAUNCH_EV_GRACE_OVER] == 1);  /* rank 1 ignores SIGTERM */
    CHECK(ev.count[TS_LAUNCH_EV_SIGNAL_DONE] == 1);
    CHECK(strstr(c.buf, "[rank 0] cleaned up\n") != NULL);
    CHECK(strstr(ev.text, "after SIGTERM: rank 0 (status 0) ended by itself; rank 1 was killed (SIGKILL)") != NULL);
    if (!strstr(c.buf, "cleaned up") || res.signal != SIGTERM) fprintf(stderr, "output: %s\nevents: %s\n", c.buf, ev.text);
}

static void test_bad_options(void) {
    char *argv[] = {"true", NULL};
    ts_launch_result res;
    ts_launch_opts o = TS_LAUNCH_OPTS_INIT;
    o.nproc = 0;
    CHECK_STATUS(ts_launch_run(&o, argv, &res), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("nproc");
    o = TS_LAUNCH_OPTS_INIT;
    o.nnodes = 2;
    CHECK_STATUS(ts_launch_run(&o, argv, &res), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("master_port");
    o = TS_LAUNCH_OPTS_INIT;
    char *missing[] = {"no-such-program-for-ts-launch", NULL};
    CHECK_STATUS(ts_launch_run(&o, missing, &res), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("not found on PATH");
}

/* ---- the failure report ----------------------------------------------------------------------------- */

static void test_report_format(void) {
    char *d = subdir("reports");
    ts__fail_report r;
    ts__fail_report_init(&r);
    r.rank = 3;
    r.world = 4;
    r.pid = 1234;
    snprintf(r.host, sizeof r.host, "node-a");
    snprintf(r.group, sizeof r.group, "my group/x");
    snprintf(r.status, sizeof r.status, "TS_ERR_TIMEOUT");
    r.cause = TS__CAUSE_HEARTBEAT;
    r.blame_rank = 1;
    r.blame_pid = 99;
    snprintf(r.blame_host, sizeof r.blame_host, "node-b");
    r.silent_s = 12.34;
    snprintf(r.blame_position, sizeof r.blame_position, "in collective #7");
    snprintf(r.op, sizeof r.op, "collective #7 all_reduce (float32 x 10)");
    r.op_seq = 7;
    snprintf(r.op_name, sizeof r.op_name, "all_reduce");
    snprintf(r.op_state, sizeof r.op_state, "started");
    r.op_for_s = 3.21;
    r.behind[0] = 1;
    r.behind[1] = 2;
    r.nbehind = 2;
    snprintf(r.reason, sizeof r.reason, "first line\nsecond line");
    CHECK_OK(ts__fail_report_write(d, &r));
    char path[1024];
    snprintf(path, sizeof path, "%s/failure-my_group_x-rank3.txt", d);
    FILE *f = fopen(path, "r");
    char first[64] = "";
    CHECK(f && fgets(first, sizeof first, f));
    if (f) fclose(f);
    CHECK(strcmp(first, "version=1\n") == 0);
    ts__fail_report b;
    CHECK_OK(ts__fail_report_read(path, &b));
    CHECK(b.version == TS__REPORT_VERSION && b.rank == 3 && b.world == 4 && b.pid == 1234);
    CHECK(strcmp(b.host, "node-a") == 0 && strcmp(b.group, "my group/x") == 0 && strcmp(b.status, "TS_ERR_TIMEOUT") == 0);
    CHECK(b.cause == TS__CAUSE_HEARTBEAT && b.blame_rank == 1 && b.blame_pid == 99 && strcmp(b.blame_host, "node-b") == 0);
    CHECK_NEAR(b.silent_s, 12.3, 1e-9);
    CHECK(strcmp(b.blame_position, "in collective #7") == 0 && strcmp(b.op, r.op) == 0 && b.op_seq == 7);
    CHECK(strcmp(b.op_name, "all_reduce") == 0 && strcmp(b.op_state, "started") == 0);
    CHECK_NEAR(b.op_for_s, 3.2, 1e-9);
    CHECK(b.nbehind == 2 && b.behind[0] == 1 && b.behind[1] == 2);
    CHECK(strcmp(b.reason, "first line second line") == 0); /* one line */
    for (int c = 0; c < TS__CAUSE_COUNT; c++) CHECK(strcmp(ts__fail_cause_name((ts__fail_cause)c), "unknown") != 0);
    CHECK(ts__fail_report_is_name("failure-my_group_x-rank3.txt"));
    CHECK(!ts__fail_report_is_name("failure-my_group_x-rank3.txt.tmp.77"));
    CHECK(!ts__fail_report_is_name("flight-default-rank0-pid1.txt"));
    /* another version is not read as this one */
    snprintf(path, sizeof path, "%s/failure-old-rank0.txt", d);
    f = fopen(path, "w");
    if (f) fputs("version=2\nrank=0\ncause=timeout\n", f), fclose(f);
    CHECK_STATUS(ts__fail_report_read(path, &b), TS_ERR_FORMAT);
    CHECK_ERR_MENTIONS("version 2");
    ts__fail_report_remove_all(d);
    CHECK(access(path, F_OK) != 0);
}

/* The flight recorder's writer and the launcher's reader agree through the header. */
static void test_flight_report(void) {
    char *d = subdir("flight");
    setenv("TS_RUN_DIR", d, 1);
    ts__flight fr;
    ts__flight_init(&fr);
    int behind[] = {2, 5};
    ts__fail_info fi;
    memset(&fi, 0, sizeof fi);
    fi.group = "default";
    fi.host = "here";
    fi.rank = 0;
    fi.world = 6;
    fi.pid = 42;
    fi.status = TS_ERR_TIMEOUT;
    fi.cause = TS__CAUSE_TIMEOUT;
    fi.reason = "collective timed out";
    fi.blame_rank = 4;
    fi.blame_pid = 7;
    fi.blame_host = "there";
    fi.silent_s = 31.0;
    fi.blame_started = fi.blame_completed = 3;
    fi.behind = behind;
    fi.nbehind = 2;
    ts__flight_report(&fr, &fi);
    ts__flight_destroy(&fr);
    unsetenv("TS_RUN_DIR");
    char path[1024];
    snprintf(path, sizeof path, "%s/failure-default-rank0.txt", d);
    ts__fail_report r;
    CHECK_OK(ts__fail_report_read(path, &r));
    CHECK(r.rank == 0 && r.world == 6 && r.pid == 42 && strcmp(r.host, "here") == 0);
    CHECK(r.cause == TS__CAUSE_TIMEOUT && strcmp(r.status, "TS_ERR_TIMEOUT") == 0);
    CHECK(r.blame_rank == 4 && r.blame_pid == 7 && strcmp(r.blame_host, "there") == 0);
    CHECK(strcmp(r.blame_position, "completed collective #3") == 0);
    CHECK(strcmp(r.op, "none") == 0 && r.op_seq == 0);
    CHECK(r.nbehind == 2 && r.behind[0] == 2 && r.behind[1] == 5);
    CHECK(strcmp(r.reason, "collective timed out") == 0);
}

int main(int argc, char **argv) {
    if (argc >= 4 && strcmp(argv[1], "--rank") == 0) return rank_main(argv[2], argv[3], argc > 4 ? argv[4] : NULL);
    ssize_t n = readlink("/proc/self/exe", self_exe, sizeof self_exe - 1);
    if (n <= 0) return 77;
    self_exe[n] = 0;
    setenv("TS_DIST_TIMEOUT", "120", 1);
    static const tu_test tests[] = {T(test_report_format), T(test_flight_report), T(test_bad_options),
                                    T(test_thread_share),  T(test_line_by_line),  T(test_terminal_redraw),
                                    T(test_sigterm_grace)};
    int rc = tu_run(tests, (int)(sizeof tests / sizeof tests[0]), argc, argv);
    if (!getenv("TS_KEEP")) tu_rm_tmpdir();
    return rc;
}
