/*
 * launch/launch.c — ts_launch_run (tessera/launch.h): checks the options, sets
 * up what every attempt shares (port, job token, run directory, output,
 * signals), runs attempts (spawn -> supervise -> next attempt while restarts
 * allow), and undoes it all. See launch.h for the other files.
 */
#include "launch/launch.h"
#include "core/env.h"

#include "distributed/heartbeat.h"
#include "distributed/report.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif

static _Atomic int launcher_running; /* one launcher per process: the signal handlers are process-wide */

double ts__launch_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void ts__launch_event(ts__launcher *L, ts_launch_event ev, const char *fmt, ...) {
    if (!L->o.on_event) return;
    char text[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    ev.text = text;
    ev.attempt = L->attempt;
    ts__launch_output_pause(L); /* a progress bar on screen would take the event's text on its line */
    L->o.on_event(&ev, L->o.user);
    ts__launch_output_resume(L);
}

const char *ts__signal_name(int sig, char *buf, size_t n) {
    static const struct {
        int sig;
        const char *name;
    } names[] = {
        {SIGHUP, "SIGHUP"},   {SIGINT, "SIGINT"},   {SIGQUIT, "SIGQUIT"}, {SIGILL, "SIGILL"},   {SIGTRAP, "SIGTRAP"},
        {SIGABRT, "SIGABRT"}, {SIGBUS, "SIGBUS"},   {SIGFPE, "SIGFPE"},   {SIGKILL, "SIGKILL"}, {SIGUSR1, "SIGUSR1"},
        {SIGSEGV, "SIGSEGV"}, {SIGUSR2, "SIGUSR2"}, {SIGPIPE, "SIGPIPE"}, {SIGALRM, "SIGALRM"}, {SIGTERM, "SIGTERM"},
        {SIGCHLD, "SIGCHLD"}, {SIGCONT, "SIGCONT"}, {SIGSTOP, "SIGSTOP"}, {SIGTSTP, "SIGTSTP"}, {SIGXCPU, "SIGXCPU"},
        {SIGXFSZ, "SIGXFSZ"}, {SIGSYS, "SIGSYS"},
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (names[i].sig == sig) return names[i].name;
    snprintf(buf, n, "%d", sig);
    return buf;
}

/* ---- options ------------------------------------------------------------------------------------ */

static ts_status check_opts(const ts_launch_opts *o, char *const argv[]) {
    TS_ARG(o->size == sizeof *o && o->magic == TS_LAUNCH_OPTS_MAGIC,
           "ts_launch_opts: size %zu / magic 0x%08x (initialise the options with TS_LAUNCH_OPTS_INIT)", o->size,
           o->magic);
    TS_ARG(o->version == TS_LAUNCH_OPTS_VERSION, "ts_launch_opts.version is %u; this library supports version %u",
           o->version, TS_LAUNCH_OPTS_VERSION);
    TS_ARG(o->nproc >= 1 && o->nproc <= TS_LAUNCH_MAX_NPROC, "ts_launch_opts.nproc is %d (expected 1..%d)", o->nproc,
           TS_LAUNCH_MAX_NPROC);
    TS_ARG(o->nnodes >= 1 && o->node_rank >= 0 && o->node_rank < o->nnodes,
           "ts_launch_opts: node_rank %d of nnodes %d (expected 0 <= node_rank < nnodes)", o->node_rank, o->nnodes);
    TS_ARG((long long)o->nproc * o->nnodes <= INT_MAX, "ts_launch_opts: world size nproc x nnodes is too large");
    TS_ARG(o->master_port >= 0 && o->master_port <= 65535, "ts_launch_opts.master_port is %d (expected 0..65535)",
           o->master_port);
    TS_ARG(o->nnodes == 1 || o->master_port > 0,
           "ts_launch_opts.master_port is required with %d nodes (every node must use the same port)", o->nnodes);
    TS_ARG(!o->master_addr || *o->master_addr, "ts_launch_opts.master_addr is empty");
    TS_ARG(o->max_restarts >= 0, "ts_launch_opts.max_restarts is %d (expected >= 0)", o->max_restarts);
    TS_ARG(isfinite(o->grace_s) && o->grace_s >= 0 && o->grace_s <= 1e6,
           "ts_launch_opts.grace_s is %g (expected 0..1e6 seconds)", o->grace_s);
    TS_ARG(o->output == TS_LAUNCH_PREFIX || o->output == TS_LAUNCH_INHERIT, "ts_launch_opts.output is %d",
           (int)o->output);
    TS_ARG(o->threads_per_rank >= -1, "ts_launch_opts.threads_per_rank is %d (expected -1, 0 or a count)",
           o->threads_per_rank);
    TS_ARG(o->out_fd >= 0 && o->err_fd >= 0, "ts_launch_opts: out_fd %d, err_fd %d", o->out_fd, o->err_fd);
    TS_ARG(argv && argv[0] && *argv[0], "ts_launch_run: no program (argv[0])");
    return ts__launch_find_program(argv[0]);
}

/* ---- descendants that outlive their rank ------------------------------------------------------------- */

static bool pid_in(pid_t p, const pid_t *set, int n) {
    for (int i = 0; i < n; i++)
        if (set[i] == p) return true;
    return false;
}

/* The children of this process (pids whose /proc stat names us as parent), at most cap, with their
 * process groups in pgid (may be NULL); zombies (already ended: descendants that died after we
 * adopted them) are reaped here, not listed, unless pre is NULL (the caller's children at the start:
 * all of them listed, none reaped). */
static int our_children(pid_t *out, pid_t *pgid, int cap, const pid_t *pre, int npre) {
    DIR *d = opendir("/proc");
    if (!d) return 0;
    pid_t me = getpid();
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < cap) {
        char *end = NULL;
        long pid = strtol(e->d_name, &end, 10);
        if (*end || pid <= 0) continue;
        char path[64], buf[512];
        snprintf(path, sizeof path, "/proc/%ld/stat", pid);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        size_t len = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        buf[len] = 0;
        const char *p = strrchr(buf, ')');
        int ppid = 0, pgrp = 0;
        char state = 0;
        if (!p || sscanf(p + 1, " %c %d %d", &state, &ppid, &pgrp) != 3 || ppid != (int)me) continue;
        if (state == 'Z' && pre && !pid_in((pid_t)pid, pre, npre)) {
            waitpid((pid_t)pid, NULL, WNOHANG);
            continue;
        }
        if (pgid) pgid[n] = (pid_t)pgrp;
        out[n++] = (pid_t)pid;
    }
    closedir(d);
    return n;
}

static bool in_rank_group(const ts__launcher *L, pid_t pgid) {
    for (int i = 0; L->ranks && i < L->n; i++)
        if (L->ranks[i].pgid > 0 && L->ranks[i].pgid == pgid) return true;
    return false;
}

/* Ranks' descendants that outlived them: as the subreaper (PR_SET_CHILD_SUBREAPER, set in setup)
 * this process adopted them when their parents died. Every child of ours that is neither a rank nor
 * one the caller had before the launcher started gets SIGTERM, SIGKILL after a short grace, and is
 * reaped; repeated while killing them orphans more (their own children come to us in turn). Those
 * still in a rank's process group already had the group's signal and are only finishing: they are
 * ended without a word; those that left it (setsid, daemons) are named. Call with the ranks reaped. */
static void kill_adopted(ts__launcher *L) {
    enum { CAP = 4096 };
    pid_t *kids = malloc(2 * CAP * sizeof *kids);
    if (!kids) return;
    pid_t *groups = kids + CAP;
    int total = 0;
    char list[256] = "";
    for (int round = 0; round < 64; round++) {
        int n = our_children(kids, groups, CAP, L->pre_children, L->npre), k = 0;
        for (int i = 0; i < n; i++)
            if (!pid_in(kids[i], L->pre_children, L->npre)) {
                groups[k] = groups[i];
                kids[k++] = kids[i];
            }
        if (!k) break;
        for (int i = 0; i < k; i++) {
            if (!in_rank_group(L, groups[i])) {
                size_t len = strlen(list);
                if (total < 8 && len + 16 < sizeof list)
                    snprintf(list + len, sizeof list - len, "%s%d", len ? ", " : "", (int)kids[i]);
                total++;
            }
            kill(kids[i], round == 0 ? SIGTERM : SIGKILL);
            kill(kids[i], SIGCONT);
        }
        double until = ts__launch_now() + fmin(L->o.grace_s, 2.0);
        for (int i = 0; i < k; i++) { /* reap: those that ended by themselves at once, the others after SIGKILL */
            while (waitpid(kids[i], NULL, WNOHANG) == 0) {
                if (ts__launch_now() >= until) {
                    kill(kids[i], SIGKILL);
                    waitpid(kids[i], NULL, 0);
                    break;
                }
                nanosleep(&(struct timespec){0, 10 * 1000 * 1000}, NULL);
            }
        }
    }
    free(kids);
    if (total)
        ts__launch_event(L, TS__LAUNCH_EV(TS_LAUNCH_EV_WARNING),
                         "ended %d process%s the ranks left running outside their process groups (pid%s %s%s)", total,
                         total == 1 ? "" : "es", total == 1 ? "" : "s", list, total > 8 ? ", ..." : "");
}

/* ---- setup and teardown ------------------------------------------------------------------------- */

/* TS_RUN_DIR for the ranks: the caller's (its old failure reports removed), else a new one. */
static void make_run_dir(ts__launcher *L) {
    const char *given = ts_env_str(TS_ENV_RUN_DIR);
    if (given && *given) {
        snprintf(L->run_dir, sizeof L->run_dir, "%s", given);
        mkdir(L->run_dir, 0777);
        ts__fail_report_remove_all(L->run_dir);
        return;
    }
    const char *tmp = getenv("TMPDIR");
    snprintf(L->run_dir, sizeof L->run_dir, "%s/tessera-run-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(L->run_dir)) {
        ts__launch_event(L, TS__LAUNCH_EV(TS_LAUNCH_EV_WARNING),
                         "cannot make a run directory (%s): %s; ranks that hang will not be named", L->run_dir,
                         strerror(errno));
        L->run_dir[0] = 0;
        return;
    }
    L->own_run_dir = true;
}

static ts_status job_token(ts__launcher *L) {
    if (ts_env_is_set(TS_ENV_JOB_TOKEN)) return TS_OK;
    if (L->o.nnodes > 1) {
        if (!ts_env_bool(TS_ENV_ALLOW_UNAUTHENTICATED))
            return ts_error(TS_ERR_INVALID_ARG,
                            "TS_JOB_TOKEN is not set: with %d nodes every node needs the same token (export "
                            "TS_JOB_TOKEN=$(od -An -N32 -tx1 /dev/urandom | tr -d ' \\n') on every node), or "
                            "TS_ALLOW_UNAUTHENTICATED=1 on every node to run without one",
                            L->o.nnodes);
        ts__launch_event(L, TS__LAUNCH_EV(TS_LAUNCH_EV_WARNING),
                         "warning: TS_JOB_TOKEN is not set and TS_ALLOW_UNAUTHENTICATED is: this %d-node job runs "
                         "unauthenticated (any process that reaches its ports can join it)",
                         L->o.nnodes);
        return TS_OK;
    }
    ts_status st = ts_job_token_new(L->job_token);
    return st == TS_OK ? TS_OK : ts__error_prefix(st, "cannot generate a job token");
}

static ts_status setup(ts__launcher *L) {
    L->port = L->o.master_port;
    L->auto_port = L->port == 0;
    if (L->auto_port && (L->port = ts__launch_listen_port(&L->listen_fd)) <= 0)
        return ts_error(TS_ERR_IO, "cannot listen on a free port of 127.0.0.1: %s (give a master port)", strerror(errno));
    TS_TRY(job_token(L));
    double hb = 0; /* the ranks' heartbeat timeout; a variable they will refuse leaves this check off */
    if (ts__heartbeat_resolve_timeout(0, &hb) != TS_OK) hb = 0;
    L->stop_limit = hb > 0 ? hb + TS__LAUNCH_STOP_MARGIN_S : 0;
    ts__launch_threads(L);
    L->n = L->o.nproc;
    L->ranks = ts__calloc((size_t)L->n, sizeof *L->ranks);
    L->pfds = ts__calloc(1 + 2 * (size_t)L->n, sizeof *L->pfds);
    if (!L->ranks || !L->pfds) return ts_error(TS_ERR_NOMEM, "ts_launch_run: %d ranks", L->n);
    for (int i = 0; i < L->n; i++) {
        ts__lrank *r = &L->ranks[i];
        r->rank = L->o.node_rank * L->o.nproc + i;
        r->out = (ts__lstream){.fd = -1, .dest = 0, .rank = r->rank};
        r->err = (ts__lstream){.fd = -1, .dest = 1, .rank = r->rank};
        r->log_fd = -1;
    }
    L->devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
    L->npre = our_children(L->pre_children, NULL, TS__LAUNCH_PRE_CHILDREN, NULL, 0);
#ifdef __linux__
    if (prctl(PR_GET_CHILD_SUBREAPER, &L->old_subreaper) == 0 && prctl(PR_SET_CHILD_SUBREAPER, 1) == 0)
        L->subreaper = true;
#endif
    make_run_dir(L);
    TS_TRY(ts__launch_output_init(L));
    return ts__launch_signals_install(L);
}

static void teardown(ts__launcher *L) {
    ts__launch_logs_close(L);
    if (L->ranks) {
        for (int i = 0; i < L->n; i++) {
            ts__lrank *r = &L->ranks[i];
            if (r->out.fd >= 0) close(r->out.fd);
            if (r->err.fd >= 0) close(r->err.fd);
            if (r->pid > 0) waitpid(r->pid, NULL, 0); /* reap the zombie */
            r->pid = 0;
        }
    }
    if (L->subreaper) {
        kill_adopted(L);
#ifdef __linux__
        prctl(PR_SET_CHILD_SUBREAPER, L->old_subreaper);
#endif
    }
    ts__launch_output_free(L);
    free(L->ranks);
    free(L->pfds);
    if (L->devnull >= 0) close(L->devnull);
    if (L->listen_fd >= 0) close(L->listen_fd);
    if (L->own_run_dir) { /* our ranks' reports only: anything else keeps it (and tells of it) */
        ts__fail_report_remove_all(L->run_dir);
        if (rmdir(L->run_dir) != 0)
            ts__launch_event(L, TS__LAUNCH_EV(TS_LAUNCH_EV_WARNING), "left %s: %s", L->run_dir, strerror(errno));
    }
    ts__launch_signals_restore(L);
    memset(L->job_token, 0, sizeof L->job_token);
}

/* ---- attempts ----------------------------------------------------------------------------------- */

/* After a failed attempt (every rank gone, pipes closed): reaps the ranks and readies the next
 * attempt. false when there is none to make: no restarts left, or a signal came meanwhile. */
static bool next_attempt(ts__launcher *L) {
    for (int i = 0; i < L->n; i++) {
        ts__lrank *r = &L->ranks[i];
        if (r->pid > 0) waitpid(r->pid, NULL, 0);
        r->pid = 0;
    }
    if (L->subreaper) kill_adopted(L); /* the last attempt's leftovers hold ports and GPUs */
    ts__launch_handle_signals(L); /* one that came after the last poll round */
    if (L->got_signal || L->attempt >= L->o.max_restarts) return false;
    if (L->auto_port) { /* a fresh port: the last attempt's clients may still knock on the old one */
        if (L->listen_fd >= 0) close(L->listen_fd);
        if ((L->port = ts__launch_listen_port(&L->listen_fd)) <= 0) {
            ts__launch_event(L, TS__LAUNCH_EV(TS_LAUNCH_EV_WARNING),
                             "cannot listen on a free port of 127.0.0.1 for the restart: %s", strerror(errno));
            return false;
        }
    }
    ts_launch_event ev = TS__LAUNCH_EV(TS_LAUNCH_EV_RESTART);
    ev.rank = L->culprit_rank;
    ev.status = L->fail_status;
    L->attempt++;
    ts__launch_event(L, ev, "restarting all %d ranks (restart %d of %d) after rank %d failed with status %d", L->n,
                     L->attempt, L->o.max_restarts, L->culprit_rank, L->fail_status);
    ts__fail_report_remove_all(L->run_dir);
    for (int i = 0; i < L->n; i++) {
        L->ranks[i].exited = false;
        L->ranks[i].status = L->ranks[i].signal = 0;
    }
    L->nexited = 0;
    L->failed = L->killed = false;
    L->fail_status = 0;
    L->culprit_rank = -1;
    L->deadline = -1;
    return true;
}

static ts_status run_attempts(ts__launcher *L, ts_launch_result *res) {
    ts_status st;
    for (;;) {
        ts__launch_logs_open(L);
        st = ts__launch_spawn_all(L);
        ts__launch_supervise(L); /* after a failed start: the ranks that were started */
        ts__launch_logs_close(L);
        if (st != TS_OK || !L->failed || L->got_signal || !next_attempt(L)) break;
    }
    if (st == TS_OK && L->failed && L->o.max_restarts > 0 && L->attempt == L->o.max_restarts && !L->got_signal) {
        ts_launch_event ev = TS__LAUNCH_EV(TS_LAUNCH_EV_NO_RESTARTS);
        ev.rank = L->culprit_rank;
        ev.status = L->fail_status;
        ts__launch_event(L, ev, "rank %d failed again; no restarts left (%d restarts made)", L->culprit_rank,
                         L->o.max_restarts);
    }
    res->attempts = L->attempt + 1;
    res->failed_rank = L->failed ? L->culprit_rank : -1;
    res->status = st != TS_OK ? 1 : L->failed ? L->fail_status : 0;
    res->signal = L->got_signal;
    if (L->got_signal) res->status = 128 + L->got_signal;
    return st;
}

ts_status ts_launch_run(const ts_launch_opts *opts, char *const argv[], ts_launch_result *result) {
    TS_ARG(opts && result, "ts_launch_run: NULL options or result");
    *result = (ts_launch_result){.failed_rank = -1};
    TS_TRY(check_opts(opts, argv));
    int expect = 0;
    if (!atomic_compare_exchange_strong(&launcher_running, &expect, 1))
        return ts_error(TS_ERR_STATE, "ts_launch_run: another launcher is running in this process");
    ts__launcher *L = ts__calloc(1, sizeof *L);
    if (!L) {
        atomic_store(&launcher_running, 0);
        return ts_error(TS_ERR_NOMEM, "ts_launch_run");
    }
    L->o = *opts;
    L->argv = argv;
    L->sig_r = L->devnull = L->listen_fd = -1;
    L->deadline = -1;
    L->culprit_rank = -1;
    L->parent = getpid();
    ts_status st = setup(L);
    if (st == TS_OK) st = run_attempts(L, result);
    teardown(L);
    free(L);
    atomic_store(&launcher_running, 0);
    return st;
}

bool ts_launch_isatty(int fd) {
    if (isatty(fd)) return true;
    if (fd != 1 && fd != 2) return false;
    struct stat sb; /* TS_OUTPUT_TERMINAL: 1 stdout, 2 stderr, 3 both */
    return (ts_env_int(TS_ENV_OUTPUT_TERMINAL) & fd) && fstat(fd, &sb) == 0 && S_ISFIFO(sb.st_mode);
}
