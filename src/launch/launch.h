/*
 * launch/launch.h — the launcher's state and the functions its files share
 * (internal; the public API is tessera/launch.h).
 *
 *   launch.c     ts_launch_run: options, setup, the loop of attempts, events, teardown
 *   spawn.c      program lookup, the port, each rank's environment, fork + exec
 *   output.c     the ranks' pipes: prefixed lines, terminal redraws, log files
 *   supervise.c  signals (a self-pipe), the poll loop, exits, the grace period
 *   verdict.c    whom a failure is about, from the failure reports (distributed/report.h)
 */
#ifndef TS_LAUNCH_LAUNCH_H
#define TS_LAUNCH_LAUNCH_H

#include "core/internal.h"
#include "tessera/dist.h"
#include "tessera/launch.h"

#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <sys/types.h>

#define TS__LAUNCH_READ_CHUNK 65536    /* bytes read from one pipe per poll round */
#define TS__LAUNCH_LINE_CAP (1 << 20)  /* a longer line is broken into pieces */
#define TS__LAUNCH_DRAIN_AFTER_KILL_S 1.0
#define TS__LAUNCH_SIGINT_REPEAT_S 0.1 /* a second SIGINT sooner than this is the first one again */
#define TS__LAUNCH_STOP_CHECK_S 0.5    /* how often the ranks' /proc state is read */
#define TS__LAUNCH_STOP_MARGIN_S 3.0   /* a rank stopped for the heartbeat timeout + this is failed by the launcher */
#define TS__LAUNCH_PRE_CHILDREN 64     /* children of the caller remembered (and spared) at the start */

/* One output pipe of a rank. */
typedef struct ts__lstream {
    int fd;        /* read end; -1 once closed (or never opened) */
    int dest;      /* 0: the launcher's out_fd, 1: its err_fd */
    int rank;
    char *buf;     /* lines mode: the partial line not yet written */
    size_t len, cap;
    char *seg;     /* terminal mode: the unfinished line's text since its last '\r' (for redraws) */
    size_t seg_len, seg_cap;
    bool open_line; /* terminal mode: this stream's current line has begun (prefix written) */
} ts__lstream;

typedef struct ts__lrank {
    pid_t pid;  /* also its process group id; 0: not running */
    pid_t pgid; /* its process group of this attempt, kept after it is reaped (0: never started) */
    int rank;  /* global rank */
    bool exited;
    int status; /* exit status, or 128 + signal */
    int signal; /* the signal that killed it, else 0 */
    ts__lstream out, err; /* err.fd is -1 when stdout and stderr share out's pipe */
    int log_fd;           /* log_dir's file for this attempt, -1: none */
    double stopped_since; /* when it was first seen stopped (state T or t); 0: running */
} ts__lrank;

#define TS__LAUNCH_NSIGS 5 /* SIGINT, SIGTERM, SIGHUP, SIGCHLD, SIGPIPE */

typedef struct ts__launcher {
    ts_launch_opts o;
    char *const *argv;
    char run_dir[PATH_MAX]; /* TS_RUN_DIR of the ranks ("" if none could be made) */
    bool own_run_dir;       /* made here: removed at the end */
    int port;
    bool auto_port; /* chosen here: a fresh one per attempt */
    int listen_fd;  /* auto_port: the store's listening socket, for rank 0; else -1 */
    int attempt;
    char job_token[TS_JOB_TOKEN_CHARS + 1]; /* generated for the ranks; "" when TS_JOB_TOKEN is set or nnodes > 1 */
    char omp_threads[16];                   /* OMP_NUM_THREADS for the ranks; "" to leave it */
    int n;
    ts__lrank *ranks;
    int nexited;
    struct pollfd *pfds;
    int sig_r;    /* self-pipe read end */
    pid_t parent; /* our pid, for the children's parent-death check */
    int devnull;  /* the ranks' stdin */
    /* output */
    bool merged;          /* out_fd and err_fd are one file: one pipe per rank */
    bool term[2];         /* prefixing to a terminal: text passed on as it comes, '\r' redraws */
    ts__lstream *shown[2]; /* terminal mode: the stream whose unfinished line is on screen */
    bool out_broken[2];   /* EPIPE: output there is dropped */
    char *obuf;           /* what one call writes */
    size_t olen, ocap;
    char *rbuf; /* one read */
    /* state of the attempt */
    bool failed;
    int fail_status, culprit_rank;
    int got_signal;      /* the first terminating signal, else 0 */
    double signal_at;    /* when it came */
    bool killed;         /* SIGKILL sent to everyone */
    double deadline;     /* monotonic time for SIGKILL; < 0: none */
    double stop_limit;   /* a rank stopped this long is failed by the launcher itself; 0: never */
    bool subreaper;      /* PR_SET_CHILD_SUBREAPER set by us (old_subreaper restored at the end) */
    int old_subreaper;
    pid_t pre_children[TS__LAUNCH_PRE_CHILDREN]; /* the caller's children before we started: never ours to end */
    int npre;
    double next_stop_check;
    struct sigaction old_act[TS__LAUNCH_NSIGS];
    sigset_t old_mask;
} ts__launcher;

double ts__launch_now(void);
/* Tells the caller (on_event) what happened; fmt makes the event's text. */
void ts__launch_event(ts__launcher *L, ts_launch_event ev, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
#define TS__LAUNCH_EV(kind_) ((ts_launch_event){.kind = (kind_), .rank = -1, .pid = -1, .blamed = -1})
/* "SIGTERM", or the number in buf. */
const char *ts__signal_name(int sig, char *buf, size_t n);

/* spawn.c */
ts_status ts__launch_find_program(const char *prog);
/* A listening socket on a free port of 127.0.0.1 (*fd, close-on-exec); returns the port, -1 with errno. */
int ts__launch_listen_port(int *fd);
/* The ranks' OMP_NUM_THREADS ("" to leave it), from the options, the environment and the CPUs. */
void ts__launch_threads(ts__launcher *L);
/* Starts every rank of the attempt; on failure kills those started and returns TS_ERR_IO. */
ts_status ts__launch_spawn_all(ts__launcher *L);

/* output.c */
ts_status ts__launch_output_init(ts__launcher *L);
void ts__launch_output_free(ts__launcher *L);
/* Opens this attempt's log files (log_dir). */
void ts__launch_logs_open(ts__launcher *L);
void ts__launch_logs_close(ts__launcher *L);
/* Reads once from s (drain: until the pipe is empty) and passes what came on; closes it at EOF. */
void ts__lstream_read(ts__launcher *L, ts__lrank *r, ts__lstream *s, bool drain);
void ts__lstream_close(ts__launcher *L, ts__lstream *s);
int ts__launch_open_streams(const ts__launcher *L);
/* Terminal mode: erases the unfinished lines on screen (before the caller prints an event), and draws
 * them again. */
void ts__launch_output_pause(ts__launcher *L);
void ts__launch_output_resume(ts__launcher *L);

/* supervise.c */
ts_status ts__launch_signals_install(ts__launcher *L);
void ts__launch_signals_restore(ts__launcher *L);
void ts__launch_signal_all(ts__launcher *L, int sig);
/* Runs the attempt until every rank has ended and their pipes are closed. */
void ts__launch_supervise(ts__launcher *L);
/* Reads pending signals (the self-pipe) and acts on them. */
void ts__launch_handle_signals(ts__launcher *L);

/* verdict.c */
/* Whom the failure of culprit (which exited non-zero) is about: tells it (EV_VERDICT) and returns that
 * global rank, or -1 when the reports and the process table name nobody else. */
int ts__launch_verdict(ts__launcher *L, const ts__lrank *culprit);
ts__lrank *ts__launch_local_rank(ts__launcher *L, int rank);
/* The scheduler state of a process ('R', 'S', 'T' stopped, 't' traced, 'Z', ...), 0 if unknown. */
char ts__launch_proc_state(pid_t pid);

#endif /* TS_LAUNCH_LAUNCH_H */
