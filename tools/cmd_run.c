/*
 * tools/cmd_run.c — `tessera run`: flags and printing over the library's
 * launcher (ts_launch_run, tessera/launch.h, which says what the ranks get and
 * how they are supervised).
 *
 *   tessera run [-n N] [--nnodes M] [--node-rank R] [--master-addr A] [--master-port P]
 *               [--max-restarts K] [--grace S] [--no-prefix] [--log-dir DIR] PROGRAM [ARGS...]
 *
 * Flags end at PROGRAM (the first argument that is not a flag) or after "--";
 * "-n N", "-nN" and "-n=N" stand for --nproc-per-node. The launcher's events go
 * to stderr as "tessera run: ..."; after a signal, tessera run dies of it
 * (status 128 + signal), as a shell expects.
 */
#include "cli.h"
#include "commands.h"
#include "tessera.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct run_args {
    int64_t nproc, nnodes, node_rank, master_port, max_restarts;
    double grace;
    const char *master_addr, *log_dir;
    bool no_prefix;
} run_args;

static const char run_summary[] =
    "Starts N processes (ranks) of PROGRAM on this node (a path, or a name looked up on PATH) with the\n"
    "distributed environment: RANK = node_rank*N + local rank, WORLD_SIZE = N*nnodes, LOCAL_RANK,\n"
    "LOCAL_WORLD_SIZE = N, GROUP_RANK, MASTER_ADDR, MASTER_PORT, TS_LAUNCHED_BY=tessera-run and TS_JOB_TOKEN\n"
    "(a fresh secret that authenticates the ranks' TCP connections, unless set; with --nnodes > 1 export the\n"
    "same TS_JOB_TOKEN on every node). -n N is --nproc-per-node N.\n"
    "\nEach rank gets its share of the CPUs: OMP_NUM_THREADS = CPUs / N unless OMP_NUM_THREADS is set, and\n"
    "OMP_WAIT_POLICY=passive unless set (waiting threads sleep instead of spinning). Programs' own --threads\n"
    "flags win.\n"
    "\nEvery output line is prefixed with \"[rank R] \"; a rank that creates a process group prints line by\n"
    "line. When stdout and stderr are one file (a terminal, > log 2>&1) a rank's stdout and stderr keep\n"
    "their order; on a terminal a progress bar redraws in place. --log-dir DIR also writes what each rank\n"
    "prints, unprefixed, to DIR/attempt_<A>/rank_<R>.log. Ranks read stdin from /dev/null.\n"
    "\nSIGINT, SIGTERM and SIGHUP are forwarded to the ranks; those still running --grace seconds later are\n"
    "killed (a second Ctrl-C kills at once), and tessera run says how each rank ended. When a rank fails\n"
    "the others get SIGTERM, then SIGKILL after --grace seconds, and tessera run exits with the failing\n"
    "rank's status (128+signal if it was killed). When ranks fail because another stopped responding\n"
    "(SIGSTOP, a debugger, a frozen host; TS_HEARTBEAT_TIMEOUT seconds, default 30), tessera run names\n"
    "that rank and the collective the others waited in, and kills it (reports in TS_RUN_DIR).\n"
    "\nWith --max-restarts K a failed group is started again, all ranks, up to K times (torchrun's restarts:\n"
    "TORCHELASTIC_RESTART_COUNT tells the ranks the attempt); programs resume themselves, e.g. tessera\n"
    "train --checkpoint-dir DIR. A signal to tessera run stops everything without a restart.\n"
    "\nexample: tessera run -n 4 ./build/my_ddp_program --epochs 2";

/* The flags before PROGRAM, with -n spelled --nproc-per-node, into fl (fl[0]: "run"). Returns PROGRAM's
 * index in argv (argc when missing), or -1 after a usage error. */
static int split_args(const cli_command *cmd, int argc, char **argv, char **fl, int *nfl, char *nbuf, size_t nlen) {
    int i = 1;
    fl[(*nfl)++] = argv[0];
    for (; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--") == 0) return i + 1;
        if (a[0] != '-' || a[1] == '\0') return i; /* PROGRAM */
        if (a[1] != '-' && strcmp(a, "-h") != 0) {
            if (a[1] != 'n') return cli_usage_error(cmd, "unknown flag '%s'", a), -1;
            const char *v = a[2] ? (a[2] == '=' ? a + 3 : a + 2) : i + 1 < argc ? argv[++i] : NULL;
            if (!v) return cli_usage_error(cmd, "-n needs a value"), -1;
            char *end = NULL;
            long long x = strtoll(v, &end, 10);
            if (end == v || *end) return cli_usage_error(cmd, "-n expects an integer, got '%s'", v), -1;
            if (x < 1 || x > TS_LAUNCH_MAX_NPROC)
                return cli_usage_error(cmd, "-n must be in [1, %d], got %lld", TS_LAUNCH_MAX_NPROC, x), -1;
            snprintf(nbuf, nlen, "--nproc-per-node=%s", v);
            fl[(*nfl)++] = nbuf;
            continue;
        }
        fl[(*nfl)++] = argv[i];
        const char *name = a + 2;
        size_t len = strcspn(name, "=");
        bool valued = false;
        for (int k = 0; k < cmd->nflags; k++)
            if (strlen(cmd->flags[k].name) == len && strncmp(cmd->flags[k].name, name, len) == 0)
                valued = cmd->flags[k].type != CLI_BOOL;
        if (valued && !name[len] && i + 1 < argc) fl[(*nfl)++] = argv[++i];
    }
    return i;
}

static void on_event(const ts_launch_event *ev, void *user) {
    const run_args *a = user;
    if (ev->kind == TS_LAUNCH_EV_NO_RESTARTS)
        fprintf(stderr, "tessera run: rank %d failed again; no restarts left (--max-restarts %lld)\n", ev->rank,
                (long long)a->max_restarts);
    else
        fprintf(stderr, "tessera run: %s\n", ev->text);
}

static int parse(int argc, char **argv, run_args *a, char ***prog) {
    const cli_flag flags[] = {
        {"nproc-per-node", CLI_INT, &a->nproc, "processes on this node (-n N)", 1, TS_LAUNCH_MAX_NPROC},
        {"nnodes", CLI_INT, &a->nnodes, "nodes in the job", 1, 1000000},
        {"node-rank", CLI_INT, &a->node_rank, "this node's index, 0..nnodes-1", 0, 999999},
        {"master-addr", CLI_STRING, &a->master_addr, "address of rank 0's node", 1, 0},
        {"master-port", CLI_INT, &a->master_port, "port of the rendezvous there (0: a free local port; required with --nnodes > 1)", 1, 65535},
        {"max-restarts", CLI_INT, &a->max_restarts, "start the ranks again after a failure, up to N times", 0, 1000000},
        {"grace", CLI_FLOAT, &a->grace, "seconds ranks get between SIGTERM and SIGKILL", 0, 1e6},
        {"no-prefix", CLI_BOOL, &a->no_prefix, "pass the ranks' output through unchanged", 0, 0},
        {"log-dir", CLI_STRING, &a->log_dir, "also write each rank's output to DIR/attempt_<A>/rank_<R>.log", 1, 0},
    };
    const cli_command cmd = {"run", "tessera run [-n N] [flags] PROGRAM [ARGS...]", run_summary, flags,
                             (int)(sizeof flags / sizeof flags[0])};
    char **fl = calloc((size_t)argc + 1, sizeof *fl), nbuf[64];
    int nfl = 0, rc = CLI_EXIT_USAGE;
    int at = fl ? split_args(&cmd, argc, argv, fl, &nfl, nbuf, sizeof nbuf) : -1;
    if (at >= 0) rc = cli_parse(&cmd, nfl, fl, NULL, 0, NULL);
    free(fl);
    if (at < 0 || rc) return at < 0 ? CLI_EXIT_USAGE : rc;
    if (at >= argc) return cli_usage_error(&cmd, "missing PROGRAM (what to run)");
    if (a->node_rank >= a->nnodes)
        return cli_usage_error(&cmd, "--node-rank %lld must be less than --nnodes %lld", (long long)a->node_rank,
                               (long long)a->nnodes);
    if (a->nnodes > 1 && a->master_port == 0)
        return cli_usage_error(&cmd, "--master-port is required with --nnodes %lld (every node must use the same port)",
                               (long long)a->nnodes);
    if (a->nproc * a->nnodes > 0x7fffffff) return cli_usage_error(&cmd, "world size -n x --nnodes is too large");
    *prog = argv + at;
    return 0;
}

int ts_cmd_run(int argc, char **argv) {
    run_args a = {.nproc = 1, .nnodes = 1, .grace = TS_LAUNCH_DEFAULT_GRACE_S, .master_addr = "127.0.0.1"};
    char **prog = NULL;
    int rc = parse(argc, argv, &a, &prog);
    if (rc) return rc == 1 ? 0 : rc;
    ts_launch_opts o = TS_LAUNCH_OPTS_INIT;
    o.nproc = (int)a.nproc;
    o.nnodes = (int)a.nnodes;
    o.node_rank = (int)a.node_rank;
    o.master_addr = a.master_addr;
    o.master_port = (int)a.master_port;
    o.max_restarts = (int)a.max_restarts;
    o.grace_s = a.grace;
    o.output = a.no_prefix ? TS_LAUNCH_INHERIT : TS_LAUNCH_PREFIX;
    o.log_dir = a.log_dir;
    o.on_event = on_event;
    o.user = &a;
    ts_launch_result res;
    fflush(NULL);
    ts_status st = ts_launch_run(&o, prog, &res);
    if (st != TS_OK) {
        fprintf(stderr, "tessera run: %s\n", ts_last_error());
        return st == TS_ERR_INVALID_ARG ? CLI_EXIT_USAGE : 1;
    }
    fflush(stdout);
    if (res.signal) { /* die of the same signal, so that a calling shell sees it (status 128+sig) */
        signal(res.signal, SIG_DFL);
        sigset_t s;
        sigemptyset(&s);
        sigaddset(&s, res.signal);
        sigprocmask(SIG_UNBLOCK, &s, NULL);
        raise(res.signal);
    }
    return res.status;
}
