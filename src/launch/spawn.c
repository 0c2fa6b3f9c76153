/*
 * launch/spawn.c — starting ranks: the program lookup (what execvp would find),
 * the rendezvous port the launcher holds for rank 0, each rank's environment
 * (built in the launcher before fork, so the child only dups and execs), and
 * fork + exec with the rank leading its own process group.
 */
#include "launch/launch.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdio.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif

extern char **environ;

/* ---- the program ---------------------------------------------------------------------------------- */

/* 0 if path is an executable regular file, else -1 with a reason in *why. */
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

ts_status ts__launch_find_program(const char *prog) {
    const char *why = NULL;
    if (strchr(prog, '/')) {
        if (check_executable(prog, &why) == 0) return TS_OK;
        return ts_error(TS_ERR_INVALID_ARG, "cannot run '%s': %s", prog, why);
    }
    const char *path = getenv("PATH");
    if (!path) path = "/bin:/usr/bin"; /* glibc's execvp default */
    bool seen = false;
    size_t plen = strlen(prog);
    for (const char *p = path;;) {
        const char *colon = strchr(p, ':');
        size_t dlen = colon ? (size_t)(colon - p) : strlen(p);
        char full[PATH_MAX];
        if (dlen + plen + 2 <= sizeof full) {
            if (dlen == 0) snprintf(full, sizeof full, "%s", prog); /* an empty entry: the current directory */
            else snprintf(full, sizeof full, "%.*s/%s", (int)dlen, p, prog);
            if (check_executable(full, &why) == 0) return TS_OK;
            seen |= access(full, F_OK) == 0;
        }
        if (!colon) break;
        p = colon + 1;
    }
    return ts_error(TS_ERR_INVALID_ARG, "cannot run '%s': %s", prog,
                    seen ? "found on PATH but not executable" : "not found on PATH");
}

/* A port of our own on 127.0.0.1 for rank 0's store: a listening socket bound to port 0 (the kernel's
 * choice), kept open (close-on-exec) and handed to rank 0 alone (TS_STORE_LISTEN_FD: the tcp store serves
 * on it instead of binding again), so no other process can take the port between its choice and the
 * store's bind — as closing a probe socket and binding again later allowed, which a machine running many
 * jobs hits now and then. */
int ts__launch_listen_port(int *fd) {
    *fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (*fd < 0) return -1;
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
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

/* ---- the rank's environment ------------------------------------------------------------------------ */

void ts__launch_threads(ts__launcher *L) {
    const char *set = getenv("OMP_NUM_THREADS");
    L->omp_threads[0] = 0;
    if (L->o.threads_per_rank > 0)
        snprintf(L->omp_threads, sizeof L->omp_threads, "%d", L->o.threads_per_rank);
    else if (L->o.threads_per_rank == 0 && !(set && *set))
        snprintf(L->omp_threads, sizeof L->omp_threads, "%d", TS_MAX(1, ts__cpu_count() / L->o.nproc));
}

/* The variables the launcher decides; every other one is inherited. */
static const char *const owned[] = {
    "RANK",        "WORLD_SIZE",  "LOCAL_RANK",         "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR",
    "MASTER_PORT", "TS_LAUNCHED_BY", "TS_STORE_LISTEN_FD", "TS_OUTPUT_TERMINAL",
    "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS",
};

static bool is_owned(const char *entry) {
    size_t n = strcspn(entry, "=");
    for (size_t i = 0; i < sizeof owned / sizeof owned[0]; i++)
        if (strlen(owned[i]) == n && strncmp(entry, owned[i], n) == 0) return true;
    return false;
}

/* Whether the launcher's environment entry e gives way to a value of the launcher's. */
static bool replaced(const ts__launcher *L, const char *e) {
    return is_owned(e) || (L->job_token[0] && strncmp(e, "TS_JOB_TOKEN=", 13) == 0) ||
           (L->run_dir[0] && strncmp(e, "TS_RUN_DIR=", 11) == 0) ||
           (L->omp_threads[0] && strncmp(e, "OMP_NUM_THREADS=", 16) == 0);
}

/* The launcher's environment with the rank's variables: a NULL-terminated array whose strings are
 * all in one allocation after it (free the array alone). NULL when out of memory. */
static char **rank_env(const ts__launcher *L, int local_rank, int rank) {
    enum { MAXADD = 24, LINE = 384 };
    char add[MAXADD][LINE];
    int na = 0;
#define ADD(...) snprintf(add[na++], LINE, __VA_ARGS__)
    ADD("RANK=%d", rank);
    ADD("WORLD_SIZE=%d", L->o.nproc * L->o.nnodes);
    ADD("LOCAL_RANK=%d", local_rank);
    ADD("LOCAL_WORLD_SIZE=%d", L->o.nproc);
    ADD("GROUP_RANK=%d", L->o.node_rank);
    ADD("MASTER_ADDR=%.300s", L->o.master_addr ? L->o.master_addr : "127.0.0.1");
    ADD("MASTER_PORT=%d", L->port);
    ADD("TS_LAUNCHED_BY=tessera-run");
    ADD("TORCHELASTIC_RESTART_COUNT=%d", L->attempt);
    ADD("TORCHELASTIC_MAX_RESTARTS=%d", L->o.max_restarts);
    if (rank == 0 && L->listen_fd >= 0) /* the launcher chose the port: only with one node */
        ADD("TS_STORE_LISTEN_FD=%d", L->listen_fd);
    int term = (L->term[0] ? 1 : 0) | (L->term[L->merged ? 0 : 1] ? 2 : 0);
    if (term) ADD("TS_OUTPUT_TERMINAL=%d", term);
    if (L->job_token[0]) ADD("TS_JOB_TOKEN=%s", L->job_token);
    if (L->run_dir[0]) ADD("TS_RUN_DIR=%.300s", L->run_dir);
    if (L->omp_threads[0]) ADD("OMP_NUM_THREADS=%s", L->omp_threads);
    for (const char *const *d = ts__threads_env_default_list(); *d && na < MAXADD; d++) {
        size_t n = strcspn(*d, "=");
        char name[64];
        snprintf(name, sizeof name, "%.*s", (int)n, *d);
        const char *v = getenv(name);
        if (!(v && *v)) ADD("%s", *d);
    }
#undef ADD
    size_t count = 0, bytes = 0;
    for (char **e = environ; e && *e; e++) {
        if (replaced(L, *e)) continue;
        count++;
        bytes += strlen(*e) + 1;
    }
    for (int i = 0; i < na; i++) bytes += strlen(add[i]) + 1;
    char **env = malloc((count + (size_t)na + 1) * sizeof *env + bytes);
    if (!env) return NULL;
    char *p = (char *)(env + count + (size_t)na + 1);
    size_t k = 0;
    for (char **e = environ; e && *e; e++) {
        if (replaced(L, *e)) continue;
        env[k++] = strcpy(p, *e);
        p += strlen(p) + 1;
    }
    for (int i = 0; i < na; i++) {
        env[k++] = strcpy(p, add[i]);
        p += strlen(p) + 1;
    }
    env[k] = NULL;
    return env;
}

/* ---- fork + exec -------------------------------------------------------------------------------- */

/* In the child after fork: never returns. */
static void exec_rank(ts__launcher *L, int rank, char **env, int out_w, int err_w) __attribute__((noreturn));
static void exec_rank(ts__launcher *L, int rank, char **env, int out_w, int err_w) {
    for (int k = 0; k < TS__LAUNCH_NSIGS; k++) {
        static const int sigs[TS__LAUNCH_NSIGS] = {SIGINT, SIGTERM, SIGHUP, SIGCHLD, SIGPIPE};
        sigaction(sigs[k], &L->old_act[k], NULL);
    }
    sigprocmask(SIG_SETMASK, &L->old_mask, NULL);
    setpgid(0, 0);
#ifdef __linux__
    prctl(PR_SET_PDEATHSIG, SIGKILL);
#endif
    if (getppid() != L->parent) _exit(1); /* the launcher is already gone */
    if (L->devnull >= 0) dup2(L->devnull, STDIN_FILENO);
    if (out_w >= 0) dup2(out_w, STDOUT_FILENO);
    if (err_w >= 0) dup2(err_w, STDERR_FILENO);
    if (L->o.output == TS_LAUNCH_INHERIT) {
        if (L->o.out_fd != STDOUT_FILENO) dup2(L->o.out_fd, STDOUT_FILENO);
        if (L->o.err_fd != STDERR_FILENO) dup2(L->o.err_fd, STDERR_FILENO);
    }
    /* every other descriptor of ours is close-on-exec; rank 0 alone keeps the store's socket */
    if (rank == 0 && L->listen_fd >= 0) fcntl(L->listen_fd, F_SETFD, 0);
    execvpe(L->argv[0], L->argv, env);
    int e = errno;
    dprintf(STDERR_FILENO, "launcher: rank %d: cannot run '%s': %s\n", rank, L->argv[0], strerror(e));
    _exit(127);
}

static int make_pipe(int fds[2]) {
    if (pipe2(fds, O_CLOEXEC) != 0) return -1;
    fcntl(fds[0], F_SETFL, fcntl(fds[0], F_GETFL) | O_NONBLOCK);
    return 0;
}

static void close_pair(int p[2]) {
    if (p[0] >= 0) close(p[0]);
    if (p[1] >= 0) close(p[1]);
    p[0] = p[1] = -1;
}

/* Starts local rank i. 0, or -1 with errno set. */
static int spawn_rank(ts__launcher *L, int i) {
    ts__lrank *r = &L->ranks[i];
    int op[2] = {-1, -1}, ep[2] = {-1, -1};
    bool pipes = L->o.output == TS_LAUNCH_PREFIX;
    if (pipes && (make_pipe(op) != 0 || (!L->merged && make_pipe(ep) != 0))) {
        int e = errno;
        close_pair(op);
        errno = e;
        return -1;
    }
    char **env = rank_env(L, i, r->rank);
    if (!env) {
        close_pair(op);
        close_pair(ep);
        errno = ENOMEM;
        return -1;
    }
    sigset_t block, prev;
    sigfillset(&block);
    sigprocmask(SIG_BLOCK, &block, &prev); /* no handler of ours runs in the child */
    pid_t pid = fork();
    if (pid == 0) {
        if (op[0] >= 0) close(op[0]);
        if (ep[0] >= 0) close(ep[0]);
        exec_rank(L, r->rank, env, op[1], L->merged ? op[1] : ep[1]);
    }
    int e = errno;
    if (pid > 0) setpgid(pid, pid); /* also here, so that kill(-pid) works at once (EACCES after exec: fine) */
    sigprocmask(SIG_SETMASK, &prev, NULL);
    free(env);
    if (op[1] >= 0) close(op[1]);
    if (ep[1] >= 0) close(ep[1]);
    if (pid < 0) {
        if (op[0] >= 0) close(op[0]);
        if (ep[0] >= 0) close(ep[0]);
        errno = e;
        return -1;
    }
    r->pid = r->pgid = pid;
    r->out.fd = op[0];
    r->err.fd = ep[0];
    return 0;
}

ts_status ts__launch_spawn_all(ts__launcher *L) {
    for (int i = 0; i < L->n; i++) {
        if (spawn_rank(L, i) == 0) continue;
        int e = errno;
        ts__launch_signal_all(L, SIGKILL);
        L->killed = true;
        L->failed = true;
        L->fail_status = 1;
        L->n = i; /* supervise only those that were started */
        return ts_error(TS_ERR_IO, "cannot start rank %d: %s", L->ranks[i].rank, strerror(e));
    }
    return TS_OK;
}
