/*
 * tessera/launch.h — the launcher: N ranks of a program on this node with the
 * distributed environment, supervised until they end (torchrun's static launch;
 * `tessera run` is flags and printing over ts_launch_run).
 *
 * What every rank gets (what ts_dist_env_read and ts_pg_new read):
 *   RANK = node_rank * nproc + local rank, WORLD_SIZE = nproc * nnodes, LOCAL_RANK,
 *   LOCAL_WORLD_SIZE = nproc, GROUP_RANK = node_rank, MASTER_ADDR, MASTER_PORT,
 *   TS_LAUNCHED_BY=tessera-run, TS_RUN_DIR (where failure reports go),
 *   TORCHELASTIC_RESTART_COUNT / TORCHELASTIC_MAX_RESTARTS, and
 *   - TS_JOB_TOKEN: a fresh ts_job_token_new() unless the launcher's environment
 *     has one (with nnodes > 1 every node must share one: the caller exports it);
 *   - its share of the CPUs: OMP_NUM_THREADS = CPUs / nproc (at least 1) unless
 *     OMP_NUM_THREADS is set or threads_per_rank says otherwise, and OpenMP's
 *     wait policy default (ts_threads_env_defaults: OMP_WAIT_POLICY=passive
 *     unless set), so that ranks neither oversubscribe the machine nor spin
 *     against each other;
 *   - stdin from /dev/null; rank 0 alone also TS_STORE_LISTEN_FD, a listening
 *     socket on MASTER_PORT the launcher chose and holds (no other process can
 *     take the port before rank 0's store serves on it).
 *
 * Output (TS_LAUNCH_PREFIX): a rank's stdout and stderr come through pipes and
 * go to out_fd and err_fd a whole line at a time as "[rank R] line"; a partial
 * last line gets a newline at the end, a line over 1 MiB is broken there. When
 * out_fd and err_fd are one file (a terminal, `> log 2>&1`), each rank's stdout
 * and stderr share one pipe, so their lines keep the order the rank wrote them
 * in. On a terminal, text is passed on as it comes instead, so a line being
 * redrawn with '\r' (a progress bar) is redrawn in place: every '\r' is followed
 * by the rank's prefix again, and a line another rank interrupts is erased and
 * drawn again after it. The ranks learn that their output ends on a terminal
 * from TS_OUTPUT_TERMINAL (ts_launch_isatty). With log_dir, everything a rank
 * writes also goes, unchanged, to log_dir/attempt_<A>/rank_<R>.log. A rank that
 * creates a process group has its stdout line-buffered from then on (ts_pg_new),
 * so printf lines arrive as they are printed. TS_LAUNCH_INHERIT hands the ranks
 * out_fd and err_fd themselves, unchanged.
 *
 * Signals: each rank leads its own process group. The first SIGINT, SIGTERM or
 * SIGHUP the launcher gets is forwarded to every rank's group (with SIGCONT, so
 * a stopped rank acts on it); ranks still running grace_s seconds later get
 * SIGKILL. Another SIGTERM or SIGHUP changes nothing (`timeout` and a kill of
 * the whole process group deliver the signal twice); another SIGINT, at least
 * 100 ms after the first, is someone pressing Ctrl-C again: SIGKILL at once.
 * When every rank has ended, an event says which ended by themselves and which
 * were killed; result->signal tells the caller to die of the signal (`tessera
 * run` exits 128 + signal). Meanwhile the launcher's handlers for SIGINT,
 * SIGTERM, SIGHUP, SIGCHLD and SIGPIPE are its own (restored on return); a
 * signal ignored when the call starts (nohup) stays ignored.
 *
 * Failure: the first rank to exit non-zero or die of a signal fails the attempt
 * (a rank killed by a signal before one that exited non-zero around the same
 * time: its death is the cause of theirs). When it exited, the failure reports
 * in TS_RUN_DIR (distributed/report.h) decide whom to blame: the rank most
 * reports say went silent (heartbeats), else a local rank that is stopped
 * (SIGSTOP, a debugger), else the rank most reports say had not started the
 * collective that timed out; a blamed local rank gets SIGKILL at once. The
 * others get SIGTERM, then SIGKILL after grace_s; with restarts left the whole
 * group starts again (a fresh port when the launcher chose it, old reports
 * removed); a signal to the launcher is never followed by a restart. Programs
 * resume themselves (tessera train --checkpoint-dir).
 *
 * No orphans: exited ranks stay zombies until the end, so their process group
 * ids cannot be reused and a kill reaches only the launcher's processes; what a
 * rank left running in its group gets SIGTERM, then SIGKILL once the output
 * pipes close or grace_s has passed. Ranks get PR_SET_PDEATHSIG(SIGKILL) on
 * Linux, in case the launcher is SIGKILLed.
 *
 * One launcher per process at a time, on one thread (a self-pipe turns signals
 * into poll() events). The library never prints: what happens is told through
 * on_event, whose text the caller prints or not.
 */
#ifndef TESSERA_LAUNCH_H
#define TESSERA_LAUNCH_H

#include "core.h"

#include <stdbool.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TS_LAUNCH_MAX_NPROC 1024       /* ranks per node (each costs up to two pipes) */
#define TS_LAUNCH_DEFAULT_GRACE_S 10.0 /* SIGTERM -> SIGKILL */

typedef enum ts_launch_output {
    TS_LAUNCH_PREFIX = 0, /* "[rank R] " before every line (see above) */
    TS_LAUNCH_INHERIT,    /* the ranks write to out_fd / err_fd directly */
} ts_launch_output;

typedef enum ts_launch_event_kind {
    TS_LAUNCH_EV_FAILED = 0,  /* the first failure of an attempt: rank, pid, status, signal (0: it exited),
                                 blamed (the rank the reports blame, -1: none) */
    TS_LAUNCH_EV_VERDICT,     /* whom the failure reports blame, and why: blamed */
    TS_LAUNCH_EV_KILL_BLAMED, /* the blamed rank runs here: SIGKILL */
    TS_LAUNCH_EV_STOPPING,    /* the other ranks get SIGTERM, SIGKILL after the grace period */
    TS_LAUNCH_EV_SIGNAL,      /* the launcher got `signal`, forwarded to the ranks */
    TS_LAUNCH_EV_SIGNAL_KILL, /* a second SIGINT: SIGKILL to every rank */
    TS_LAUNCH_EV_GRACE_OVER,  /* ranks still running grace_s after SIGTERM: SIGKILL */
    TS_LAUNCH_EV_SIGNAL_DONE, /* after a signal: how the ranks ended (by themselves, killed) */
    TS_LAUNCH_EV_RESTART,     /* a new attempt (attempt) after rank `rank` failed with `status` */
    TS_LAUNCH_EV_NO_RESTARTS, /* the last attempt failed too */
    TS_LAUNCH_EV_WARNING,     /* something that does not stop the run (no job token for several nodes, ...) */
} ts_launch_event_kind;

typedef struct ts_launch_event {
    ts_launch_event_kind kind;
    int rank, pid;   /* the rank concerned (global), -1: none */
    int status;      /* its exit status (128 + signal when killed) */
    int signal;      /* the signal it died of, or the one the launcher got; 0: none */
    int blamed;      /* FAILED, VERDICT: the rank blamed, -1: none */
    int attempt;     /* 0, then 1.. after restarts */
    const char *text; /* one line saying it, without a trailing newline; valid during the call */
} ts_launch_event;

typedef void (*ts_launch_event_fn)(const ts_launch_event *ev, void *user);

typedef struct ts_launch_opts {
    size_t size;          /* sizeof(ts_launch_opts) */
    unsigned int magic;   /* TS_LAUNCH_OPTS_MAGIC */
    unsigned int version; /* TS_LAUNCH_OPTS_VERSION */
    int nproc;            /* ranks on this node, 1..TS_LAUNCH_MAX_NPROC */
    int nnodes;           /* nodes in the job (>= 1) */
    int node_rank;        /* this node, 0..nnodes-1 */
    const char *master_addr; /* rank 0's node; NULL: 127.0.0.1 */
    int master_port;      /* 0: a free port of 127.0.0.1, chosen per attempt (nnodes 1 only) */
    int max_restarts;     /* start a failed group again, up to this many times */
    double grace_s;       /* seconds between SIGTERM and SIGKILL (>= 0) */
    ts_launch_output output;
    const char *log_dir;  /* NULL: no log files */
    /* OMP_NUM_THREADS for the ranks: 0: CPUs / nproc unless OMP_NUM_THREADS is set; > 0: this many;
     * -1: leave the environment alone (a rank that creates a process group then takes its share itself) */
    int threads_per_rank;
    int out_fd, err_fd;   /* where the ranks' output goes (1 and 2) */
    ts_launch_event_fn on_event; /* NULL: events are dropped */
    void *user;
} ts_launch_opts;

#define TS_LAUNCH_OPTS_MAGIC 0x7e5a1a01u
#define TS_LAUNCH_OPTS_VERSION 1u
#define TS_LAUNCH_OPTS_INIT                                                                                    \
    ((ts_launch_opts){.size = sizeof(ts_launch_opts), .magic = TS_LAUNCH_OPTS_MAGIC,                           \
                      .version = TS_LAUNCH_OPTS_VERSION, .nproc = 1, .nnodes = 1, .grace_s = TS_LAUNCH_DEFAULT_GRACE_S, \
                      .out_fd = 1, .err_fd = 2})

typedef struct ts_launch_result {
    int status;      /* what the launcher should exit with: 0, the failing rank's status (128 + signal
                        when a signal killed it), 1 when a rank could not be started */
    int signal;      /* the first SIGINT/SIGTERM/SIGHUP the launcher got, else 0: die of it */
    int failed_rank; /* the rank whose failure ended the last attempt, -1: none */
    int attempts;    /* attempts started (1 + restarts) */
} ts_launch_result;

/* Runs argv (argv[0]: a path, or a name looked up on PATH; NULL-terminated; read
 * during the call only) as opts->nproc ranks and supervises them until every one
 * has ended, restarts included. TS_OK once ranks were started, whatever became of
 * them (*result says); TS_ERR_INVALID_ARG for options out of range (naming the
 * field) or a program that cannot be run ("cannot run 'x': not found on PATH");
 * TS_ERR_STATE while another launcher runs in this process; TS_ERR_IO when the
 * port, pipes or a process cannot be had. */
ts_status ts_launch_run(const ts_launch_opts *opts, char *const argv[], ts_launch_result *result);

/* Whether output to fd (1 or 2) ends on a terminal: isatty(fd), or fd is the
 * pipe of a launcher that passes '\r' redraws on to a terminal (TS_OUTPUT_TERMINAL,
 * set by ts_launch_run). What a progress bar asks before drawing in place. */
bool ts_launch_isatty(int fd);

#ifdef __cplusplus
}
#endif

#endif /* TESSERA_LAUNCH_H */
