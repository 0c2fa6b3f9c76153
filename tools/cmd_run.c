/*
 * tools/cmd_run.c — `tessera run`: the launcher (torchrun's static launch).
 *
 *   tessera run -n N [--nnodes M] [--node-rank R] [--master-addr A]
 *               [--master-port P] [--max-restarts K] [--no-prefix]
 *               [--grace S] PROGRAM [ARGS...]
 *
 * Starts N local ranks of PROGRAM, each with RANK, WORLD_SIZE, LOCAL_RANK,
 * LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT and TS_LAUNCHED_BY in
 * its environment (what ts_dist_env_read reads), and supervises them:
 *
 *  - Job token: unless TS_JOB_TOKEN is already set, the ranks get a fresh one
 *    (32 random bytes in hex) that authenticates their TCP store and TCP links
 *    (distributed/auth.h). With --nnodes > 1 every node must share one: the
 *    user exports it on every node, else the job runs unauthenticated (warned).
 *  - Output: every rank's stdout and stderr come through pipes and are written
 *    out a whole line at a time as "[rank R] line" (stdout to stdout, stderr
 *    to stderr); a partial last line gets a newline at EOF, and a line longer
 *    than LINE_CAP bytes is broken there. --no-prefix hands the ranks the
 *    launcher's own stdout/stderr instead (unchanged, still a tty if it was).
 *  - Signals: each rank leads its own process group. SIGINT, SIGTERM and SIGHUP
 *    sent to the launcher are forwarded to every group; any second one sends
 *    SIGKILL; ranks still alive --grace seconds after the first are killed too.
 *    After cleanup the launcher dies of the signal it got (status 128+sig).
 *  - Failure: the first rank to exit non-zero or die of a signal is reported
 *    ("rank R (pid P) exited with status S"), every group gets SIGTERM (and
 *    SIGCONT, so that stopped processes act on it), then SIGKILL after --grace
 *    seconds, and the launcher exits with that status (128+sig for a signal).
 *  - Liveness verdict: ranks get TS_RUN_DIR, a directory of this run (the
 *    caller's TS_RUN_DIR, else a fresh one under TMPDIR, removed at the end)
 *    where a process group that fails writes failure-<group>-rank<R>.txt
 *    (src/distributed/flight.c). When the first failing rank exited (not by a
 *    signal), the reports decide whom to blame: the rank that the most
 *    reports say was silent (heartbeat), else a local rank that is stopped
 *    (state T in /proc), else the rank the most reports say had not started
 *    the collective that timed out. That rank is named first ("rank R (pid P
 *    on H) stopped responding: rank Q waited for it in collective #S ...")
 *    and, when it is ours, gets SIGKILL at once (a stopped process acts on
 *    nothing else).
 *  - Restarts (--max-restarts N, torchrun's): after a failure, once every
 *    rank of the attempt is gone, the whole group is started again, up to N
 *    times, with TORCHELASTIC_RESTART_COUNT = the attempt number (0 first)
 *    and TORCHELASTIC_MAX_RESTARTS = N; a fresh port when none was given and
 *    the old reports removed. A signal to the launcher is never followed by a
 *    restart. The program resumes itself (tessera train --checkpoint-dir).
 *  - No orphans: exited ranks are left as zombies (detected with waitid
 *    WNOWAIT) until the end, so their pids, which are their process group ids,
 *    cannot be reused and kill(-pgid) only ever reaches our processes. At the
 *    end, processes a rank left behind in its group get SIGTERM, then SIGKILL
 *    once the output pipes are closed or --grace has passed. Ranks also get
 *    PR_SET_PDEATHSIG(SIGKILL) on Linux, in case the launcher is SIGKILLed.
 *
 * Everything runs on one thread: a self-pipe turns signals into poll() events.
 */
#include "cli.h"
#include "commands.h"
#include "distributed/auth.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif

#define MAX_NPROC 1024         /* ranks per node (each costs two pipes) */
#define READ_CHUNK 65536       /* bytes read from one pipe per poll round */
#define LINE_CAP (1 << 20)     /* a longer line is broken into pieces */
#define DRAIN_AFTER_KILL_S 1.0 /* how long to wait for pipes after the final SIGKILL */

/* ---- options ----------------------------------------------------------------------------- */

typedef struct run_opts {
    int64_t nproc, nnodes, node_rank, master_port, max_restarts;
    double grace;
    const char *master_addr;
    bool no_prefix;
    char **prog_argv; /* PROGRAM ARGS..., NULL-terminated (points into argv) */
} run_opts;

static const char run_usage[] =
    "usage: tessera run -n N [--nnodes M] [--node-rank R] [--master-addr A] [--master-port P]\n"
    "                   [--max-restarts K] [--no-prefix] [--grace SECONDS] PROGRAM [ARGS...]\n";

static void print_help(FILE *f) {
    fprintf(f, "%s", run_usage);
    fprintf(f,
            "\nStarts N processes of PROGRAM on this node (a path, or a name looked up on PATH)\n"
            "with the distributed environment: RANK = node_rank*N + local_rank, WORLD_SIZE =\n"
            "N*nnodes, LOCAL_RANK, LOCAL_WORLD_SIZE = N, GROUP_RANK = node_rank, MASTER_ADDR,\n"
            "MASTER_PORT, TS_LAUNCHED_BY=tessera-run and TS_JOB_TOKEN (a fresh random secret\n"
            "that authenticates the ranks' TCP connections, unless already set; with\n"
            "--nnodes > 1 export the same TS_JOB_TOKEN on every node). Every output line is\n"
            "prefixed with \"[rank R] \". SIGINT, SIGTERM and SIGHUP are forwarded to the\n"
            "ranks (a second one kills them). When a rank fails the others get SIGTERM, then\n"
            "SIGKILL after --grace seconds, and tessera run exits with the failing rank's\n"
            "status (128+signal if it was killed). Ranks read stdin from /dev/null.\n"
            "\nWhen ranks fail because another rank stopped responding (its heartbeats stopped:\n"
            "SIGSTOP, a debugger, a frozen host; TS_HEARTBEAT_TIMEOUT seconds, default 30), tessera\n"
            "run names that rank and the collective the others waited in, and kills it. Ranks\n"
            "report failures in TS_RUN_DIR (a temporary directory unless set).\n"
            "\nWith --max-restarts K a failed group is started again, all ranks, up to K times\n"
            "(torchrun's restarts: TORCHELASTIC_RESTART_COUNT tells the ranks the attempt);\n"
            "programs resume themselves, e.g. tessera train --checkpoint-dir DIR. A signal to\n"
            "tessera run stops everything without a restart.\n"
            "\nflags:\n"
            "  -n, --nproc-per-node N   processes on this node, 1..%d (default 1)\n"
            "  --nnodes M               nodes in the job (default 1)\n"
            "  --node-rank R            this node's index, 0..M-1 (default 0)\n"
            "  --master-addr A          address of rank 0's node (default 127.0.0.1)\n"
            "  --master-port P          port of the rendezvous on it (default with --nnodes 1:\n"
            "                           a free local port; required with --nnodes > 1)\n"
            "  --max-restarts K         start the ranks again after a failure, up to K times (default 0)\n"
            "  --no-prefix              pass the ranks' output through unchanged\n"
            "  --grace SECONDS          how long ranks get between SIGTERM and SIGKILL (default 10)\n"
            "  --help                   show this help\n"
            "\nexample: tessera run -n 4 ./build/my_ddp_program --epochs 2\n",
            MAX_NPROC);
}

static int run_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int run_error(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "tessera run: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, " (see 'tessera run --help')\n");
    va_end(ap);
    return CLI_EXIT_USAGE;
}

static int parse_int_flag(const char *flag, const char *v, int64_t lo, int64_t hi, int64_t *out) {
    char *end = NULL;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (errno || end == v || *end) return run_error("%s expects an integer, got '%s'", flag, v);
    if (x < lo || x > hi) return run_error("%s must be in [%lld, %lld], got %lld", flag, (long long)lo, (long long)hi, x);
    *out = x;
    return 0;
}

/* Parses the flags up to PROGRAM (the first argument that is not a flag, or
 * the one after "--"). Returns 0 to go on, 1 after --help, or CLI_EXIT_USAGE. */
static int parse_args(int argc, char **argv, run_opts *o) {
    bool port_seen = false;
    int i = 1;
    for (; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--") == 0) {
            i++;
            break;
        }
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            print_help(stdout);
            return 1;
        }
        if (a[0] != '-' || a[1] == '\0') break; /* PROGRAM */
        /* the flag's name and value: "-n N", "-nN", "--flag V", "--flag=V" */
        char name[64];
        const char *v = NULL;
        if (a[1] != '-') {
            if (a[1] != 'n') return run_error("unknown flag '%s'", a);
            snprintf(name, sizeof name, "-n");
            if (a[2]) v = a[2] == '=' ? a + 3 : a + 2;
        } else {
            const char *eq = strchr(a, '=');
            size_t len = eq ? (size_t)(eq - a) : strlen(a);
            if (len >= sizeof name) return run_error("unknown flag '%.*s'", (int)len, a);
            memcpy(name, a, len);
            name[len] = '\0';
            if (eq) v = eq + 1;
        }
        if (strcmp(name, "--no-prefix") == 0) {
            if (v) return run_error("--no-prefix takes no value");
            o->no_prefix = true;
            continue;
        }
        static const char *const valued[] = {"-n",          "--nproc-per-node", "--nnodes",       "--node-rank",
                                             "--master-addr", "--master-port",  "--max-restarts", "--grace"};
        bool known = false;
        for (size_t k = 0; k < sizeof valued / sizeof valued[0]; k++) known |= strcmp(name, valued[k]) == 0;
        if (!known) return run_error("unknown flag '%s'", name);
        if (!v) {
            if (i + 1 >= argc) return run_error("%s needs a value", name);
            v = argv[++i];
        }
        int rc = 0;
        if (strcmp(name, "-n") == 0 || strcmp(name, "--nproc-per-node") == 0) {
            rc = parse_int_flag(name, v, 1, MAX_NPROC, &o->nproc);
        } else if (strcmp(name, "--nnodes") == 0) {
            rc = parse_int_flag(name, v, 1, 1000000, &o->nnodes);
        } else if (strcmp(name, "--node-rank") == 0) {
            rc = parse_int_flag(name, v, 0, 999999, &o->node_rank);
        } else if (strcmp(name, "--master-port") == 0) {
            rc = parse_int_flag(name, v, 1, 65535, &o->master_port);
            port_seen = true;
        } else if (strcmp(name, "--max-restarts") == 0) {
            rc = parse_int_flag(name, v, 0, 1000000, &o->max_restarts);
        } else if (strcmp(name, "--master-addr") == 0) {
            if (!*v) return run_error("--master-addr expects a non-empty value");
            o->master_addr = v;
        } else { /* --grace */
            char *end = NULL;
            errno = 0;
            double x = strtod(v, &end);
            if (errno || end == v || *end || !isfinite(x)) return run_error("--grace expects a number, got '%s'", v);
            if (x < 0 || x > 1e6) return run_error("--grace must be in [0, 1e6], got %g", x);
            o->grace = x;
        }
        if (rc) return rc;
    }
    if (i >= argc) return run_error("missing PROGRAM (what to run)");
    if (o->node_rank >= o->nnodes)
        return run_error("--node-rank %lld must be less than --nnodes %lld", (long long)o->node_rank,
                         (long long)o->nnodes);
    if (o->nnodes > 1 && !port_seen)
        return run_error("--master-port is required with --nnodes %lld (every node must use the same port)",
                         (long long)o->nnodes);
    if (o->nproc * o->nnodes > INT_MAX) return run_error("world size -n x --nnodes is too large");
    o->prog_argv = argv + i;
    return 0;
}

/* ---- program lookup and the free port ----------------------------------------------------- */

/* 0 if path is an executable regular file, else an errno-like reason in *why. */
static int check_executable(const char *path, const char **why) {
    struct stat sb;
    if (stat(path, &sb) != 0) {
        *why = strerror(errno);
        return -1;
    }
    if (S_ISDIR(sb.st_mode)) {
        *why = "is a directory";
        return -1;
    }
    if (!S_ISREG(sb.st_mode) || access(path, X_OK) != 0) {
        *why = "not executable";
        return -1;
    }
    return 0;
}

/* What execvp would find: a path as is, else the first executable PATH entry. */
static int find_program(const char *prog, const char **why) {
    if (strchr(prog, '/')) return check_executable(prog, why);
    const char *path = getenv("PATH");
    if (!path) path = "/bin:/usr/bin"; /* glibc's execvp default */
    bool seen = false;
    size_t plen = strlen(prog);
    for (const char *p = path;;) {
        const char *colon = strchr(p, ':');
        size_t dlen = colon ? (size_t)(colon - p) : strlen(p);
        char full[PATH_MAX];
        if (dlen + plen + 2 <= sizeof full) {
            if (dlen == 0) snprintf(full, sizeof full, "%s", prog); /* empty entry: the current directory */
            else snprintf(full, sizeof full, "%.*s/%s", (int)dlen, p, prog);
            const char *w = NULL;
            if (check_executable(full, &w) == 0) return 0;
            seen |= access(full, F_OK) == 0;
        }
        if (!colon) break;
        p = colon + 1;
    }
    *why = seen ? "found on PATH but not executable" : "not found on PATH";
    return -1;
}

/* A port of our own on 127.0.0.1 for rank 0's store: a listening socket bound to port 0 (the kernel's
 * choice), kept open (close-on-exec) and handed to rank 0 alone (TS_STORE_LISTEN_FD: the tcp store serves
 * on it instead of binding again), so no other process can take the port between its choice and the
 * store's bind — as closing a probe socket and binding again later allowed, which a machine running many
 * jobs hits now and then. Returns the port, *fd the socket; -1 with errno set. */
static int listen_free_port(int *fd) {
    *fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (*fd < 0) return -1;
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    sa.sin_port = 0;
    socklen_t len = sizeof sa;
    if (bind(*fd, (struct sockaddr *)&sa, sizeof sa) == 0 && listen(*fd, SOMAXCONN) == 0 &&
        getsockname(*fd, (struct sockaddr *)&sa, &len) == 0)
        return ntohs(sa.sin_port);
    int e = errno;
    close(*fd);
    *fd = -1;
    errno = e;
    return -1;
}

/* ---- signals ---------------------------------------------------------------------------------- */

static int sig_pipe_w = -1; /* the self-pipe's write end, for the handler */

static void on_signal(int sig) {
    int saved = errno;
    unsigned char b = (unsigned char)sig;
    ssize_t r = write(sig_pipe_w, &b, 1); /* full pipe: the byte is dropped (only SIGCHLD floods) */
    (void)r;
    errno = saved;
}

static const int handled_sigs[] = {SIGINT, SIGTERM, SIGHUP, SIGCHLD, SIGPIPE};
#define NHANDLED ((int)(sizeof handled_sigs / sizeof handled_sigs[0]))

static const char *signal_name(int sig, char *buf, size_t n) {
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

/* ---- the launcher's state ------------------------------------------------------------------- */

typedef struct stream {
    int fd;     /* read end of the pipe; -1 once closed */
    int out_fd; /* STDOUT_FILENO or STDERR_FILENO */
    char *buf;  /* the current partial line */
    size_t len, cap;
} stream;

typedef struct rank_proc {
    pid_t pid; /* also its process group id */
    int rank;  /* global rank */
    bool exited;
    int status; /* exit status, or 128+signal */
    int signal; /* the signal that killed it, else 0 */
    stream out, err;
} rank_proc;

typedef struct launcher {
    run_opts o;
    char run_dir[PATH_MAX]; /* TS_RUN_DIR of the ranks ("" if none could be made) */
    bool own_run_dir;       /* made by us: removed at the end */
    int port;
    bool auto_port; /* chosen by us: a fresh one for each attempt */
    int listen_fd;  /* auto_port: the store's listening socket, for rank 0 (listen_free_port); else -1 */
    int attempt;    /* 0, then 1.. after restarts */
    char job_token[TS__JOB_TOKEN_CHARS + 1]; /* generated for the ranks; "" when TS_JOB_TOKEN was set or nnodes > 1 */
    int n;
    rank_proc *ranks;
    int nexited;
    int sig_r;         /* self-pipe read end */
    pid_t parent;      /* our pid, for the children's parent-death check */
    int devnull;       /* the ranks' stdin */
    bool failed;       /* a rank failed first */
    int fail_status;
    int culprit_rank;  /* the rank that failed first, -1: none */
    int got_signal;    /* the first terminating signal received first, else 0 */
    int nsignals;
    bool killed;       /* SIGKILL sent to everyone */
    double deadline;   /* monotonic time for SIGKILL; < 0: none */
    char *outbuf;      /* scratch for prefixed output */
    size_t outcap;
    bool out_broken[3]; /* stdout/stderr gave EPIPE: drop further output */
    struct sigaction old_act[NHANDLED];
    sigset_t old_mask;
} launcher;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void signal_all(launcher *L, int sig) {
    for (int i = 0; i < L->n; i++)
        if (L->ranks[i].pid > 0) kill(-L->ranks[i].pid, sig); /* exited ranks are zombies: the pgid is still ours */
}

/* ---- output ----------------------------------------------------------------------------------- */

static void write_all(launcher *L, int fd, const char *p, size_t n) {
    while (n > 0 && !L->out_broken[fd]) {
        ssize_t w = write(fd, p, n);
        if (w > 0) {
            p += w;
            n -= (size_t)w;
        } else if (w < 0 && errno == EINTR) {
            continue;
        } else if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            struct pollfd pf = {.fd = fd, .events = POLLOUT};
            poll(&pf, 1, 100);
        } else {
            L->out_broken[fd] = true; /* EPIPE and friends: nobody is reading */
        }
    }
}

static bool reserve(char **buf, size_t *cap, size_t need) {
    if (need <= *cap) return true;
    size_t c = *cap ? *cap : 4096;
    while (c < need) c *= 2;
    char *nb = realloc(*buf, c);
    if (!nb) return false;
    *buf = nb;
    *cap = c;
    return true;
}

/* Writes s's complete lines (and, with flush_all, the rest) prefixed with "[rank R] ". */
static void stream_emit(launcher *L, stream *s, int rank, bool flush_all) {
    char prefix[32];
    int plen = snprintf(prefix, sizeof prefix, "[rank %d] ", rank);
    size_t start = 0, o = 0;
    for (;;) {
        size_t avail = s->len - start, end; /* end: one past the line's last byte (without the newline) */
        char *nl = avail ? memchr(s->buf + start, '\n', avail < LINE_CAP + 1 ? avail : LINE_CAP + 1) : NULL;
        if (nl) end = (size_t)(nl - s->buf);
        else if (avail >= LINE_CAP) end = start + LINE_CAP;
        else if (avail && flush_all) end = s->len;
        else break;
        size_t ll = end - start;
        if (!reserve(&L->outbuf, &L->outcap, o + (size_t)plen + ll + 1)) break;
        memcpy(L->outbuf + o, prefix, (size_t)plen);
        memcpy(L->outbuf + o + plen, s->buf + start, ll);
        o += (size_t)plen + ll;
        L->outbuf[o++] = '\n';
        start = nl ? end + 1 : end;
    }
    if (o) write_all(L, s->out_fd, L->outbuf, o);
    if (start) {
        memmove(s->buf, s->buf + start, s->len - start);
        s->len -= start;
    }
}

static void stream_close(launcher *L, stream *s, int rank) {
    if (s->fd < 0) return;
    stream_emit(L, s, rank, true);
    close(s->fd);
    s->fd = -1;
}

/* Reads once (drain: until the pipe is empty). Closes the stream at EOF or on error. */
static void stream_read(launcher *L, stream *s, int rank, bool drain) {
    while (s->fd >= 0) {
        if (!reserve(&s->buf, &s->cap, s->len + READ_CHUNK)) {
            stream_emit(L, s, rank, true); /* out of memory: write out what we have */
            if (!reserve(&s->buf, &s->cap, s->len + READ_CHUNK)) {
                stream_close(L, s, rank); /* rather than spin on a readable pipe */
                return;
            }
        }
        ssize_t r = read(s->fd, s->buf + s->len, READ_CHUNK);
        if (r > 0) {
            s->len += (size_t)r;
            stream_emit(L, s, rank, false);
            if (!drain) return;
        } else if (r < 0 && errno == EINTR) {
            continue;
        } else if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            return;
        } else {
            stream_close(L, s, rank); /* EOF or a real error */
        }
    }
}

static int open_streams(const launcher *L) {
    int k = 0;
    for (int i = 0; i < L->n; i++) k += (L->ranks[i].out.fd >= 0) + (L->ranks[i].err.fd >= 0);
    return k;
}

/* ---- children --------------------------------------------------------------------------------- */

static void set_env_int(const char *name, long long v) {
    char b[32];
    snprintf(b, sizeof b, "%lld", v);
    setenv(name, b, 1);
}

/* In the child after fork: never returns. */
static void exec_rank(launcher *L, int local_rank, int rank, int out_w, int err_w) __attribute__((noreturn));
static void exec_rank(launcher *L, int local_rank, int rank, int out_w, int err_w) {
    for (int k = 0; k < NHANDLED; k++) sigaction(handled_sigs[k], &L->old_act[k], NULL);
    sigprocmask(SIG_SETMASK, &L->old_mask, NULL);
    setpgid(0, 0);
#ifdef __linux__
    prctl(PR_SET_PDEATHSIG, SIGKILL);
#endif
    if (getppid() != L->parent) _exit(1); /* the launcher is already gone */
    if (L->devnull >= 0) dup2(L->devnull, STDIN_FILENO);
    if (out_w >= 0) dup2(out_w, STDOUT_FILENO);
    if (err_w >= 0) dup2(err_w, STDERR_FILENO);
    /* every other descriptor of ours is close-on-exec */
    set_env_int("RANK", rank);
    set_env_int("WORLD_SIZE", L->o.nproc * L->o.nnodes);
    set_env_int("LOCAL_RANK", local_rank);
    set_env_int("LOCAL_WORLD_SIZE", L->o.nproc);
    set_env_int("GROUP_RANK", L->o.node_rank);
    setenv("MASTER_ADDR", L->o.master_addr, 1);
    set_env_int("MASTER_PORT", L->port);
    if (rank == 0 && L->listen_fd >= 0 && fcntl(L->listen_fd, F_SETFD, 0) == 0) /* inherited by rank 0 alone */
        set_env_int("TS_STORE_LISTEN_FD", L->listen_fd);
    else
        unsetenv("TS_STORE_LISTEN_FD");
    setenv("TS_LAUNCHED_BY", "tessera-run", 1);
    if (L->job_token[0]) setenv("TS_JOB_TOKEN", L->job_token, 1);
    if (L->run_dir[0]) setenv("TS_RUN_DIR", L->run_dir, 1);
    set_env_int("TORCHELASTIC_RESTART_COUNT", L->attempt);
    set_env_int("TORCHELASTIC_MAX_RESTARTS", L->o.max_restarts);
    execvp(L->o.prog_argv[0], L->o.prog_argv);
    int e = errno;
    dprintf(STDERR_FILENO, "tessera run: rank %d: cannot run '%s': %s\n", rank, L->o.prog_argv[0], strerror(e));
    _exit(127);
}

static int make_pipe(int fds[2]) {
    if (pipe2(fds, O_CLOEXEC) != 0) return -1;
    fcntl(fds[0], F_SETFL, fcntl(fds[0], F_GETFL) | O_NONBLOCK);
    return 0;
}

/* Starts rank i. Returns 0, or -1 with errno set. */
static int spawn_rank(launcher *L, int i) {
    rank_proc *r = &L->ranks[i];
    int op[2] = {-1, -1}, ep[2] = {-1, -1};
    if (!L->o.no_prefix && (make_pipe(op) != 0 || make_pipe(ep) != 0)) {
        int e = errno;
        if (op[0] >= 0) close(op[0]), close(op[1]);
        errno = e;
        return -1;
    }
    sigset_t block, prev;
    sigemptyset(&block);
    for (int k = 0; k < NHANDLED; k++) sigaddset(&block, handled_sigs[k]);
    sigprocmask(SIG_BLOCK, &block, &prev);
    pid_t pid = fork();
    if (pid == 0) {
        if (op[0] >= 0) close(op[0]), close(ep[0]);
        exec_rank(L, i, r->rank, op[1], ep[1]);
    }
    int e = errno;
    if (pid > 0) setpgid(pid, pid); /* also here, so that kill(-pid) works at once (EACCES after exec: fine) */
    sigprocmask(SIG_SETMASK, &prev, NULL);
    if (op[1] >= 0) close(op[1]), close(ep[1]);
    if (pid < 0) {
        if (op[0] >= 0) close(op[0]), close(ep[0]);
        errno = e;
        return -1;
    }
    r->pid = pid;
    r->out.fd = op[0];
    r->err.fd = ep[0];
    return 0;
}

/* ---- the liveness verdict ------------------------------------------------------------------------- */

/* One failure report (see src/distributed/flight.c for the format). */
typedef struct report {
    int rank, pid, blame_rank, blame_pid;
    double silent_s, op_for_s;
    char cause[16], host[64], blame_host[64], op[200], blame_pos[96];
    int behind[64], nbehind;
} report;

static void parse_report(FILE *f, report *r) {
    memset(r, 0, sizeof *r);
    r->rank = r->blame_rank = -1;
    char line[1200];
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = 0;
        char *v = strchr(line, '=');
        if (!v) continue;
        *v++ = 0;
        if (strcmp(line, "rank") == 0) r->rank = atoi(v);
        else if (strcmp(line, "pid") == 0) r->pid = atoi(v);
        else if (strcmp(line, "blame_rank") == 0) r->blame_rank = atoi(v);
        else if (strcmp(line, "blame_pid") == 0) r->blame_pid = atoi(v);
        else if (strcmp(line, "silent_s") == 0) r->silent_s = atof(v);
        else if (strcmp(line, "op_for_s") == 0) r->op_for_s = atof(v);
        else if (strcmp(line, "cause") == 0) snprintf(r->cause, sizeof r->cause, "%s", v);
        else if (strcmp(line, "host") == 0) snprintf(r->host, sizeof r->host, "%s", v);
        else if (strcmp(line, "blame_host") == 0) snprintf(r->blame_host, sizeof r->blame_host, "%s", v);
        else if (strcmp(line, "blame_position") == 0) snprintf(r->blame_pos, sizeof r->blame_pos, "%s", v);
        else if (strcmp(line, "op") == 0) snprintf(r->op, sizeof r->op, "%s", v);
        else if (strcmp(line, "behind") == 0)
            for (char *t = strtok(v, ","); t && r->nbehind < 64; t = strtok(NULL, ",")) r->behind[r->nbehind++] = atoi(t);
    }
}

/* Every report in the run directory (at most cap). */
static int read_reports(const launcher *L, report *out, int cap) {
    int n = 0;
    DIR *d = L->run_dir[0] ? opendir(L->run_dir) : NULL;
    if (!d) return 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < cap) {
        size_t len = strlen(e->d_name);
        if (strncmp(e->d_name, "failure-", 8) != 0 || len < 4 || strcmp(e->d_name + len - 4, ".txt") != 0) continue;
        char path[PATH_MAX + 256];
        snprintf(path, sizeof path, "%s/%s", L->run_dir, e->d_name);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        parse_report(f, &out[n]);
        fclose(f);
        if (out[n].rank >= 0) n++;
    }
    closedir(d);
    return n;
}

/* The scheduler state of a process ('R', 'S', 'T' stopped, 't' traced, 'Z', ...), 0 if unknown. */
static char proc_state(pid_t pid) {
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    const char *p = strrchr(buf, ')');
    return p && p[1] == ' ' ? p[2] : 0;
}

static rank_proc *local_rank(launcher *L, int rank) {
    for (int i = 0; i < L->n; i++)
        if (L->ranks[i].rank == rank) return &L->ranks[i];
    return NULL;
}

/* The rank named most often in votes[0..n) (ties: the lowest), or -1. */
static int most_named(const int *votes, int n) {
    int best = -1, best_count = 0;
    for (int i = 0; i < n; i++) {
        int c = 0;
        for (int j = 0; j < n; j++) c += votes[j] == votes[i];
        if (c > best_count || (c == best_count && votes[i] < best)) best = votes[i], best_count = c;
    }
    return best;
}

/* What we can see of a rank: "; it is stopped (...)", "; it is still running (...)", "; it is on another
 * node", or "" (it exited, or /proc cannot tell). */
static void local_state(launcher *L, int rank, char *buf, size_t n) {
    rank_proc *p = local_rank(L, rank);
    buf[0] = 0;
    if (!p) {
        snprintf(buf, n, "; it is on another node");
        return;
    }
    if (p->exited) return;
    char st = proc_state(p->pid);
    if (st == 'T') snprintf(buf, n, "; it is stopped (SIGSTOP or job control)");
    else if (st == 't') snprintf(buf, n, "; it is stopped by a debugger (traced)");
    else if (st) snprintf(buf, n, "; it is still running (state %c: hung?)", st);
}

/* Whom the failure of culprit (which exited non-zero) is really about: prints
 * the verdict and returns that global rank, or -1 when the reports and the
 * process table name nobody else. */
static int liveness_verdict(launcher *L, rank_proc *culprit) {
    report *rep = calloc(256, sizeof *rep);
    int nrep = rep ? read_reports(L, rep, 256) : 0, votes[256], nv = 0, blamed = -1;
    char state[96];
    /* 1. heartbeats: the rank that reports say was silent while they waited on it (reports of
     *    ranks that gave up on it first; else of ranks that failed otherwise while it was silent) */
    for (int pass = 0; pass < 2 && blamed < 0; pass++) {
        bool hb_only = pass == 0;
        nv = 0;
        for (int i = 0; i < nrep; i++)
            if (rep[i].blame_rank >= 0 && (strcmp(rep[i].cause, "heartbeat") == 0) == hb_only)
                votes[nv++] = rep[i].blame_rank;
        if ((blamed = most_named(votes, nv)) < 0) continue;
        const report *ex = NULL;
        char others[128] = "";
        for (int i = 0; i < nrep; i++)
            if (rep[i].blame_rank == blamed && (strcmp(rep[i].cause, "heartbeat") == 0) == hb_only &&
                (!ex || rep[i].rank == culprit->rank))
                ex = &rep[i];
        for (int i = 0; i < nrep; i++)
            if (&rep[i] != ex && rep[i].blame_rank == blamed && strlen(others) < sizeof others - 16)
                snprintf(others + strlen(others), sizeof others - strlen(others), "%s%d", others[0] ? ", " : "",
                         rep[i].rank);
        local_state(L, blamed, state, sizeof state);
        fprintf(stderr,
                "tessera run: rank %d (pid %d on %s) stopped responding: rank %d %s %s and had not heard from it "
                "for %.1f s%s%s%s%s%s%s\n",
                blamed, ex->blame_pid, ex->blame_host, ex->rank, hb_only ? "waited for it in" : "failed in", ex->op,
                ex->silent_s, others[0] ? " (nor had rank " : "", others, others[0] ? ")" : "",
                ex->blame_pos[0] ? "; its last heartbeat: " : "", ex->blame_pos, state);
    }
    /* 2. a local rank that is stopped */
    if (blamed < 0) {
        for (int i = 0; i < L->n && blamed < 0; i++) {
            rank_proc *p = &L->ranks[i];
            char st = p->exited ? 0 : proc_state(p->pid);
            if (st == 'T' || st == 't') {
                blamed = p->rank;
                const report *own = NULL; /* what the failing rank was in, if it said */
                for (int k = 0; k < nrep; k++)
                    if (rep[k].rank == culprit->rank && strcmp(rep[k].op, "none") != 0) own = &rep[k];
                fprintf(stderr, "tessera run: rank %d (pid %d) is stopped%s; rank %d failed%s%s%s\n", p->rank,
                        (int)p->pid, st == 't' ? " by a debugger" : " (SIGSTOP or job control)", culprit->rank,
                        own ? " in " : "", own ? own->op : "", own ? "" : " meanwhile");
            }
        }
    }
    /* 3. a collective timed out: the rank(s) that had not started it */
    if (blamed < 0) {
        nv = 0;
        const report *ex = NULL;
        for (int i = 0; i < nrep; i++) {
            if (strcmp(rep[i].cause, "timeout") != 0) continue;
            for (int k = 0; k < rep[i].nbehind && nv < 256; k++) votes[nv++] = rep[i].behind[k];
            if (rep[i].nbehind && (!ex || rep[i].rank == culprit->rank)) ex = &rep[i];
        }
        if ((blamed = most_named(votes, nv)) >= 0 && ex) {
            local_state(L, blamed, state, sizeof state);
            fprintf(stderr, "tessera run: rank %d never reached %s, which rank %d waited in for %.1f s%s\n", blamed,
                    ex->op, ex->rank, ex->op_for_s, state);
        }
    }
    free(rep);
    return blamed;
}

/* ---- supervision ------------------------------------------------------------------------------ */

/* Marks the ranks that exited since the last look (leaving them zombies) and returns the failure to
 * report among them: a rank killed by a signal before one that exited non-zero; else culprit. */
static rank_proc *reap_exits(launcher *L, rank_proc *culprit) {
    for (int i = 0; i < L->n; i++) {
        rank_proc *r = &L->ranks[i];
        if (r->exited || r->pid <= 0) continue;
        siginfo_t si;
        memset(&si, 0, sizeof si);
        if (waitid(P_PID, (id_t)r->pid, &si, WEXITED | WNOHANG | WNOWAIT) != 0 || si.si_pid == 0) continue;
        r->exited = true;
        L->nexited++;
        bool by_signal = si.si_code == CLD_KILLED || si.si_code == CLD_DUMPED;
        r->signal = by_signal ? si.si_status : 0;
        r->status = by_signal ? 128 + si.si_status : si.si_status;
        /* its last words first, then our verdict */
        stream_read(L, &r->out, r->rank, true);
        stream_read(L, &r->err, r->rank, true);
        if (r->status != 0 && (!culprit || (r->signal && !culprit->signal))) culprit = r;
    }
    return culprit;
}

/* Time a rank that exited non-zero gets for a peer's death to become visible (see check_exits). */
#define EXIT_SETTLE_S 0.25

/* Notices ranks that exited and reports the first failure. Ranks that exit
 * together are judged together: a rank killed by a signal is the cause, and
 * peers that exit non-zero because it vanished (their collectives fail at once)
 * are not, whatever order waitid finds them in. A killed process closes its
 * sockets before it becomes a zombie, so a peer can see it gone, exit and be
 * reaped first: a non-zero exit waits up to EXIT_SETTLE_S for such a death. */
static void check_exits(launcher *L) {
    rank_proc *culprit = reap_exits(L, NULL);
    if (!culprit || L->failed || L->got_signal) return;
    for (double until = now_s() + EXIT_SETTLE_S; !culprit->signal && L->nexited < L->n && now_s() < until;) {
        nanosleep(&(struct timespec){0, 10 * 1000 * 1000}, NULL);
        culprit = reap_exits(L, culprit);
    }
    char b[16];
    int blamed = culprit->signal ? -1 : liveness_verdict(L, culprit);
    if (culprit->signal)
        fprintf(stderr, "tessera run: rank %d (pid %d) was killed by signal %s\n", culprit->rank, (int)culprit->pid,
                signal_name(culprit->signal, b, sizeof b));
    else if (blamed >= 0)
        fprintf(stderr, "tessera run: rank %d (pid %d) exited with status %d after waiting for rank %d\n",
                culprit->rank, (int)culprit->pid, culprit->status, blamed);
    else
        fprintf(stderr, "tessera run: rank %d (pid %d) exited with status %d\n", culprit->rank, (int)culprit->pid,
                culprit->status);
    L->failed = true;
    L->fail_status = culprit->status;
    L->culprit_rank = culprit->rank;
    rank_proc *hung = blamed >= 0 ? local_rank(L, blamed) : NULL;
    if (hung && !hung->exited) {
        fprintf(stderr, "tessera run: killing rank %d (pid %d, SIGKILL)\n", hung->rank, (int)hung->pid);
        kill(-hung->pid, SIGKILL);
    }
    if (L->nexited < L->n && L->nexited + (hung && !hung->exited) < L->n)
        fprintf(stderr, "tessera run: stopping the other ranks (SIGTERM, then SIGKILL after %gs)\n", L->o.grace);
    signal_all(L, SIGTERM);
    signal_all(L, SIGCONT); /* a stopped process acts on SIGTERM only once it runs */
    L->deadline = now_s() + L->o.grace;
}

static void on_terminating_signal(launcher *L, int sig) {
    char b[16];
    L->nsignals++;
    if (L->nsignals == 1 && !L->failed) {
        L->got_signal = sig;
        fprintf(stderr, "tessera run: got %s; forwarding it to the ranks (again: SIGKILL)\n", signal_name(sig, b, sizeof b));
        signal_all(L, sig);
        L->deadline = now_s() + L->o.grace;
    } else if (!L->killed) {
        fprintf(stderr, "tessera run: got %s again; killing the ranks\n", signal_name(sig, b, sizeof b));
        signal_all(L, SIGKILL);
        L->killed = true;
        L->deadline = -1;
    }
}

/* Reads pending signals from the self-pipe. */
static void handle_signals(launcher *L) {
    unsigned char b[64];
    ssize_t r;
    while ((r = read(L->sig_r, b, sizeof b)) > 0)
        for (ssize_t k = 0; k < r; k++)
            if (b[k] == SIGINT || b[k] == SIGTERM || b[k] == SIGHUP) on_terminating_signal(L, b[k]);
    /* SIGCHLD: check_exits runs every round; SIGPIPE: write_all sees EPIPE */
}

/* One poll round over the self-pipe and every open stream; timeout in seconds (< 0: none). */
static void poll_round(launcher *L, struct pollfd *pfds, double timeout) {
    int np = 0;
    pfds[np++] = (struct pollfd){.fd = L->sig_r, .events = POLLIN};
    for (int i = 0; i < L->n; i++) {
        pfds[np++] = (struct pollfd){.fd = L->ranks[i].out.fd, .events = POLLIN}; /* fd -1 is skipped */
        pfds[np++] = (struct pollfd){.fd = L->ranks[i].err.fd, .events = POLLIN};
    }
    int ms = timeout < 0 ? -1 : (int)fmin(ceil(timeout * 1000.0), 1e9);
    int rc = poll(pfds, (nfds_t)np, ms);
    if (rc <= 0) return; /* timeout or EINTR: the caller looks again */
    if (pfds[0].revents) handle_signals(L);
    for (int i = 0; i < L->n; i++) {
        rank_proc *r = &L->ranks[i];
        if (pfds[1 + 2 * i].revents) stream_read(L, &r->out, r->rank, false);
        if (pfds[2 + 2 * i].revents) stream_read(L, &r->err, r->rank, false);
    }
}

static void supervise(launcher *L, struct pollfd *pfds) {
    while (L->nexited < L->n) {
        check_exits(L);
        if (L->nexited == L->n) break;
        double now = now_s();
        if (L->deadline >= 0 && now >= L->deadline) {
            fprintf(stderr, "tessera run: ranks still running %gs after SIGTERM; sending SIGKILL\n", L->o.grace);
            signal_all(L, SIGKILL);
            L->killed = true;
            L->deadline = -1;
            continue;
        }
        poll_round(L, pfds, L->deadline < 0 ? -1.0 : L->deadline - now);
    }
    /* Every rank has exited. Whatever is left in their process groups gets
     * SIGTERM, and SIGKILL once the pipes are closed or --grace is over. */
    signal_all(L, SIGTERM);
    double end = now_s() + L->o.grace;
    bool final_kill = false;
    while (open_streams(L) > 0) {
        double now = now_s();
        if (now >= end || (L->killed && !final_kill)) {
            if (final_kill) break;
            signal_all(L, SIGKILL);
            final_kill = true;
            end = now + DRAIN_AFTER_KILL_S;
            continue;
        }
        poll_round(L, pfds, end - now);
    }
    if (!final_kill) signal_all(L, SIGKILL);
    for (int i = 0; i < L->n; i++) {
        stream_close(L, &L->ranks[i].out, L->ranks[i].rank);
        stream_close(L, &L->ranks[i].err, L->ranks[i].rank);
    }
}

/* ---- entry point ------------------------------------------------------------------------------ */

static void remove_reports(const launcher *L) {
    DIR *d = L->run_dir[0] ? opendir(L->run_dir) : NULL;
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (strncmp(e->d_name, "failure-", 8) != 0) continue;
        char path[PATH_MAX + 256];
        snprintf(path, sizeof path, "%s/%s", L->run_dir, e->d_name);
        unlink(path);
    }
    closedir(d);
}

/* TS_RUN_DIR for the ranks: the caller's (its old failure reports removed), else a new one. */
static void make_run_dir(launcher *L) {
    const char *given = getenv("TS_RUN_DIR");
    if (given && *given) {
        snprintf(L->run_dir, sizeof L->run_dir, "%s", given);
        mkdir(L->run_dir, 0777);
        remove_reports(L);
        return;
    }
    const char *tmp = getenv("TMPDIR");
    snprintf(L->run_dir, sizeof L->run_dir, "%s/tessera-run-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(L->run_dir)) {
        fprintf(stderr, "tessera run: cannot make a run directory (%s): %s; ranks that hang will not be named\n",
                L->run_dir, strerror(errno));
        L->run_dir[0] = 0;
        return;
    }
    L->own_run_dir = true;
}

/* Starts every rank of this attempt. false (the started ones killed) if one could not be. */
static bool spawn_all(launcher *L) {
    for (int i = 0; i < L->n; i++) {
        if (spawn_rank(L, i) == 0) continue;
        fprintf(stderr, "tessera run: cannot start rank %d: %s\n", L->ranks[i].rank, strerror(errno));
        signal_all(L, SIGKILL);
        L->killed = true;
        L->failed = true;
        L->fail_status = 1;
        L->n = i; /* supervise only those that were started */
        return false;
    }
    return true;
}

/* After a failed attempt (every rank gone, pipes closed): reaps the ranks and
 * readies the next attempt. false when there is none to make: no restarts
 * left, or a signal came in meanwhile. */
static bool next_attempt(launcher *L, int culprit_rank) {
    for (int i = 0; i < L->n; i++) {
        rank_proc *r = &L->ranks[i];
        if (r->pid > 0) waitpid(r->pid, NULL, 0);
        r->pid = 0;
    }
    handle_signals(L); /* one that came after the last poll round */
    if (L->got_signal || L->nsignals || L->attempt >= L->o.max_restarts) return false;
    int port = L->port;
    if (L->auto_port) { /* a fresh port: the last attempt's clients may still knock on the old one */
        if (L->listen_fd >= 0) close(L->listen_fd);
        if ((port = listen_free_port(&L->listen_fd)) <= 0) {
            fprintf(stderr, "tessera run: cannot listen on a free port of 127.0.0.1 for the restart: %s\n",
                    strerror(errno));
            return false;
        }
    }
    L->attempt++;
    fprintf(stderr, "tessera run: restarting all %d ranks (restart %d of %lld) after rank %d failed with status %d\n",
            L->n, L->attempt, (long long)L->o.max_restarts, culprit_rank, L->fail_status);
    L->port = port;
    remove_reports(L);
    for (int i = 0; i < L->n; i++) {
        rank_proc *r = &L->ranks[i];
        r->exited = false;
        r->status = r->signal = 0;
    }
    L->nexited = 0;
    L->failed = L->killed = false;
    L->fail_status = 0;
    L->culprit_rank = -1;
    L->deadline = -1;
    return true;
}

static void launcher_free(launcher *L) {
    if (L->ranks) {
        for (int i = 0; i < L->n; i++) {
            rank_proc *r = &L->ranks[i];
            if (r->out.fd >= 0) close(r->out.fd);
            if (r->err.fd >= 0) close(r->err.fd);
            free(r->out.buf);
            free(r->err.buf);
            if (r->pid > 0) waitpid(r->pid, NULL, 0); /* reap the zombie */
        }
    }
    free(L->ranks);
    free(L->outbuf);
    if (L->devnull >= 0) close(L->devnull);
    if (L->listen_fd >= 0) close(L->listen_fd);
    if (L->sig_r >= 0) close(L->sig_r);
    if (L->own_run_dir) { /* our ranks' reports only: anything else keeps it (and tells of it) */
        remove_reports(L);
        if (rmdir(L->run_dir) != 0) fprintf(stderr, "tessera run: left %s: %s\n", L->run_dir, strerror(errno));
    }
    if (sig_pipe_w >= 0) close(sig_pipe_w);
    sig_pipe_w = -1;
    for (int k = 0; k < NHANDLED; k++) sigaction(handled_sigs[k], &L->old_act[k], NULL);
}

int ts_cmd_run(int argc, char **argv) {
    launcher L;
    memset(&L, 0, sizeof L);
    L.o = (run_opts){.nproc = 1, .nnodes = 1, .node_rank = 0, .master_port = 0, .grace = 10.0,
                     .master_addr = "127.0.0.1"};
    L.sig_r = L.devnull = L.listen_fd = -1;
    L.deadline = -1;
    int rc = parse_args(argc, argv, &L.o);
    if (rc) return rc == 1 ? 0 : rc;

    const char *why = NULL;
    if (find_program(L.o.prog_argv[0], &why) != 0) {
        fprintf(stderr, "tessera run: cannot run '%s': %s\n", L.o.prog_argv[0], why);
        return CLI_EXIT_USAGE;
    }
    L.port = (int)L.o.master_port;
    L.auto_port = L.port == 0;
    L.culprit_rank = -1;
    if (L.port == 0 && (L.port = listen_free_port(&L.listen_fd)) <= 0) {
        fprintf(stderr, "tessera run: cannot listen on a free port of 127.0.0.1: %s (give --master-port)\n",
                strerror(errno));
        return 1;
    }

    const char *tok = getenv("TS_JOB_TOKEN");
    if (!(tok && *tok) && L.o.nnodes > 1) {
        fprintf(stderr, "tessera run: warning: TS_JOB_TOKEN is not set; with --nnodes %lld every node needs the same "
                        "token, so this job runs unauthenticated (export TS_JOB_TOKEN=$(od -An -N32 -tx1 /dev/urandom "
                        "| tr -d ' \\n') on every node)\n",
                (long long)L.o.nnodes);
    } else if (!(tok && *tok) && ts__auth_new_token(L.job_token) != TS_OK) {
        fprintf(stderr, "tessera run: cannot generate a job token: %s\n", ts_last_error());
        if (L.listen_fd >= 0) close(L.listen_fd);
        return 1;
    }

    L.n = (int)L.o.nproc;
    L.parent = getpid();
    L.ranks = calloc((size_t)L.n, sizeof *L.ranks);
    struct pollfd *pfds = calloc(1 + 2 * (size_t)L.n, sizeof *pfds);
    int sp[2];
    if (!L.ranks || !pfds || pipe2(sp, O_CLOEXEC | O_NONBLOCK) != 0) {
        fprintf(stderr, "tessera run: %s\n", strerror(errno ? errno : ENOMEM));
        free(pfds);
        free(L.ranks);
        if (L.listen_fd >= 0) close(L.listen_fd);
        return 1;
    }
    L.sig_r = sp[0];
    sig_pipe_w = sp[1];
    L.devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
    make_run_dir(&L);
    for (int i = 0; i < L.n; i++) {
        L.ranks[i].rank = (int)(L.o.node_rank * L.o.nproc) + i;
        L.ranks[i].out = (stream){.fd = -1, .out_fd = STDOUT_FILENO};
        L.ranks[i].err = (stream){.fd = -1, .out_fd = STDERR_FILENO};
    }

    /* Install the handlers; a signal the launcher was started with ignored
     * (nohup, a background job's SIGINT) stays ignored, as shells do. */
    sigprocmask(SIG_SETMASK, NULL, &L.old_mask);
    for (int k = 0; k < NHANDLED; k++) {
        sigaction(handled_sigs[k], NULL, &L.old_act[k]);
        if (L.old_act[k].sa_handler == SIG_IGN && handled_sigs[k] != SIGCHLD) continue;
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_signal;
        sigemptyset(&sa.sa_mask);
        sa.sa_flags = SA_RESTART | (handled_sigs[k] == SIGCHLD ? SA_NOCLDSTOP : 0);
        sigaction(handled_sigs[k], &sa, NULL);
    }

    int status = 0;
    for (;;) {
        bool started = spawn_all(&L);
        supervise(&L, pfds);
        if (!started || !L.failed || L.got_signal || !next_attempt(&L, L.culprit_rank)) break;
    }
    if (L.failed && L.o.max_restarts > 0 && L.attempt == L.o.max_restarts && !L.got_signal)
        fprintf(stderr, "tessera run: rank %d failed again; no restarts left (--max-restarts %lld)\n", L.culprit_rank,
                (long long)L.o.max_restarts);
    free(pfds);
    if (L.failed) status = L.fail_status;
    int sig = L.got_signal;
    fflush(stdout);
    launcher_free(&L);
    if (sig) {
        /* die of the same signal, so that a calling shell sees it (status 128+sig) */
        signal(sig, SIG_DFL);
        sigset_t s;
        sigemptyset(&s);
        sigaddset(&s, sig);
        sigprocmask(SIG_UNBLOCK, &s, NULL);
        raise(sig);
        status = 128 + sig;
    }
    return status;
}
