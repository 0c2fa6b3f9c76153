/*
 * tools/cmd_bench_allreduce.c — `tessera bench allreduce`: all-reduce
 * bandwidth and latency, nccl-tests style (bench/allreduce_vs.sh puts
 * PyTorch's gloo and OpenMPI beside it).
 *
 * Forks N processes (default 2) that join a process group through env://
 * on 127.0.0.1 and a free port (under a launcher that says the job has several
 * processes — tessera run --nnodes M, torchrun, srun — it is one rank of that
 * job instead: across hosts, ranks on one host share memory and the hosts talk
 * TCP; the header prints rank 0's links), then times in-place f32 sum all-reduces
 * from 8 B to 256 MiB (powers of two, or --step 4): warm-up, then repeated
 * calls for about --time seconds per size. Prints, from rank 0,
 *     size  count  time(us)  algbw(GB/s)  busbw(GB/s)
 * with algbw = bytes / time and busbw = algbw * 2(n-1)/n (the bandwidth each
 * link sustains in a ring; comparable across world sizes), or a JSON array
 * with --json. Each size is first checked once for exact results.
 *
 *   tessera bench allreduce [-n N] [--min-bytes B] [--max-bytes B] [--step 2|4]
 *                   [--time S] [--transport shm|tcp] [--backend builtin|mpi|nccl] [--dtype float32|bfloat16] [--json]
 *
 * --dtype bfloat16 times the reduction DDP's --ddp-comm bf16 runs: half the bytes per element.
 *
 * --backend mpi runs under mpirun instead of forking (MPI's ranks are its
 * processes): `mpirun -n 2 tessera bench allreduce --backend mpi`.
 *
 * --backend nccl (CUDA builds) reduces a buffer in GPU memory, rank r on
 * cuda:LOCAL_RANK (one GPU per rank, as NCCL wants): each size is a device tensor
 * filled from the host, checked on the host, then timed; each call waits for its
 * collective to finish (nccl-tests' busbw is measured the same way per call when
 * run with -b/-e and one iteration per launch).
 *
 * Sizes are checked before anything starts (a number with an optional k/m/g
 * suffix; every rank allocates --max-bytes, so N of them must fit in the
 * machine's memory), and the parent names every rank that failed or was killed
 * by a signal (e.g. SIGBUS), so a run never ends with a bare exit status 1.
 */
#include "cli.h"
#include "commands.h"
#include "core/env.h"
#include "tessera.h"

#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

typedef struct bench_opts {
    int nprocs;
    size_t min_bytes, max_bytes;
    int step;
    double time_s;
    bool json;
    const char *backend;        /* ts_run_backend_name(backend_kind), for ts_pg_options */
    ts_run_backend backend_kind; /* builtin, mpi or nccl */
    ts_dtype dt; /* float32 or bfloat16 */
} bench_opts;

/* Every element of buf (count of dt) = v. */
static void fill_value(void *buf, size_t count, ts_dtype dt, float v) {
    if (dt == TS_F32)
        for (size_t i = 0; i < count; i++) ((float *)buf)[i] = v;
    else
        for (size_t i = 0; i < count; i++) ((uint16_t *)buf)[i] = ts_f32_to_bf16(v);
}

static float value_at(const void *buf, size_t i, ts_dtype dt) {
    return dt == TS_F32 ? ((const float *)buf)[i] : ts_bf16_to_f32(((const uint16_t *)buf)[i]);
}

static int free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {0};
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t sl = sizeof sa;
    if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0 || getsockname(fd, (struct sockaddr *)&sa, &sl) != 0) {
        if (fd >= 0) close(fd);
        return -1;
    }
    close(fd);
    return ntohs(sa.sin_port);
}

/* A byte count: a number (1e6 is fine) with an optional k/m/g suffix (KiB, MiB, GiB). *ok is false
 * for anything else, for values below 1 and for values that do not fit a size_t. */
static size_t parse_bytes(const char *s, bool *ok) {
    char *end = NULL;
    errno = 0;
    double v = strtod(s, &end);
    *ok = end != s && errno == 0 && isfinite(v);
    if (*ok && (*end == 'k' || *end == 'K')) v *= 1024, end++;
    else if (*ok && (*end == 'm' || *end == 'M')) v *= 1024 * 1024, end++;
    else if (*ok && (*end == 'g' || *end == 'G')) v *= 1024.0 * 1024 * 1024, end++;
    *ok = *ok && *end == '\0' && v >= 1 && v < 9.2e18;
    return *ok ? (size_t)v : 0;
}

/* One size: checked once for exact results, warmed up, then timed for about time_s; rank 0 prints the row.
 * *t: --backend nccl's buffer on gpu (replaced for this size). Returns 0 or 1 (the error printed). */
static int time_size(const bench_opts *o, ts_process_group *pg, ts_device *gpu, void *buf, size_t bytes, ts_tensor **t,
                     bool first) {
    const ts_dtype dt = o->dt;
    const size_t es = ts_dtype_size(dt), count = bytes / es;
    const int n = ts_pg_size(pg), rank = ts_pg_rank(pg);
    /* exact check: every element sums to n(n+1)/2 (exact in bfloat16 up to 22 ranks) */
    fill_value(buf, count, dt, (float)(rank + 1));
    ts_tensor_release(*t);
    *t = NULL;
    if (gpu) {
        int64_t c = (int64_t)count;
        if (ts_tensor_empty(gpu, dt, 1, &c, t) != TS_OK || ts_tensor_from_host(*t, buf, count * es) != TS_OK ||
            ts_all_reduce(pg, *t, TS_REDUCE_SUM, NULL) != TS_OK || ts_tensor_to_host(*t, buf, count * es) != TS_OK) {
            fprintf(stderr, "rank %d: all_reduce on %s: %s\n", rank, ts_device_name(gpu), ts_last_error());
            return 1;
        }
    } else if (ts_all_reduce_buffer(pg, buf, count, dt, TS_REDUCE_SUM, NULL) != TS_OK) {
        fprintf(stderr, "rank %d: all_reduce: %s\n", rank, ts_last_error());
        return 1;
    }
    int wrong = 0; /* reported, and the size still timed: the other ranks' collectives must be matched */
    for (size_t i = 0; i < count && (dt == TS_F32 || n <= 22) && !wrong; i++)
        if (value_at(buf, i, dt) != (float)(n * (n + 1) / 2)) {
            fprintf(stderr, "rank %d: wrong result at %zu of %zu: %g\n", rank, i, count, (double)value_at(buf, i, dt));
            wrong = 1;
        }
    memset(buf, 0, count * es);
    /* warm up, then pick an iteration count that takes about time_s (all ranks agree: rank 0 decides) */
    double t0 = ts_time_now();
    int warm = bytes <= (1u << 20) ? 50 : 3; /* the same on every rank: collectives must match */
    for (int it = 0; it < warm; it++)
        if (*t) ts_all_reduce(pg, *t, TS_REDUCE_SUM, NULL);
        else ts_all_reduce_buffer(pg, buf, count, dt, TS_REDUCE_SUM, NULL);
    float iters_f = (float)(o->time_s / ((ts_time_now() - t0) / warm));
    iters_f = iters_f < 3 ? 3 : iters_f > 100000 ? 100000 : iters_f;
    ts_all_reduce_buffer(pg, &iters_f, 1, TS_F32, TS_REDUCE_MAX, NULL);
    int iters = (int)iters_f;
    ts_barrier(pg, NULL);
    t0 = ts_time_now();
    for (int it = 0; it < iters; it++)
        if ((*t ? ts_all_reduce(pg, *t, TS_REDUCE_SUM, NULL) : ts_all_reduce_buffer(pg, buf, count, dt, TS_REDUCE_SUM, NULL)) != TS_OK) {
            fprintf(stderr, "rank %d: all_reduce: %s\n", rank, ts_last_error());
            return 1;
        }
    double sec = (ts_time_now() - t0) / iters;
    if (wrong) return 1;
    double algbw = (double)(count * es) / sec / 1e9, busbw = algbw * 2.0 * (n - 1) / n;
    if (rank == 0) {
        if (o->json)
            printf("%s  {\"bytes\": %zu, \"count\": %zu, \"nprocs\": %d, \"iters\": %d, \"time_us\": %.3f, "
                   "\"algbw_gbs\": %.4f, \"busbw_gbs\": %.4f}",
                   first ? "" : ",\n", count * es, count, n, iters, sec * 1e6, algbw, busbw);
        else
            printf("  %12zu %12zu %12.2f %12.3f %12.3f\n", count * es, count, sec * 1e6, algbw, busbw);
        fflush(stdout);
    }
    return 0;
}

/* --backend nccl: the rank's GPU (cuda:LOCAL_RANK), where the buffer lives; NULL for the others. */
static int rank_gpu(const bench_opts *o, ts_process_group *pg, ts_device **gpu) {
    *gpu = NULL;
    if (o->backend_kind != TS_RUN_BACKEND_NCCL) return 0;
    char name[32];
    snprintf(name, sizeof name, "cuda:%d", ts_pg_local_rank(pg) > 0 ? ts_pg_local_rank(pg) : 0);
    if (ts_device_get(name, gpu) == TS_OK) return 0;
    fprintf(stderr, "rank %d: %s\n", ts_pg_rank(pg), ts_last_error());
    return 1;
}

static int run_rank(const bench_opts *o, int rank) {
    ts_pg_options po = TS_PG_OPTIONS_INIT;
    po.init_method = "env://";
    po.timeout_s = 120;
    po.backend = o->backend;
    ts_process_group *pg = NULL;
    if (ts_pg_new(&po, &pg) != TS_OK) {
        fprintf(stderr, "rank %d: ts_pg_new: %s\n", rank, ts_last_error());
        return 1;
    }
    ts_device *gpu = NULL;
    const size_t es = ts_dtype_size(o->dt), maxcount = (o->max_bytes + es - 1) / es;
    void *buf = NULL;
    if (rank_gpu(o, pg, &gpu) != 0) {
        ts_pg_free(pg);
        return 1;
    }
    if (!(buf = aligned_alloc(64, ((maxcount * es + 63) / 64) * 64 + 64))) {
        fprintf(stderr, "rank %d: cannot allocate the %zu-byte buffer of --max-bytes: %s\n", rank, maxcount * es,
                strerror(errno ? errno : ENOMEM));
        ts_pg_free(pg);
        return 1;
    }
    memset(buf, 0, maxcount * es);
    if (rank == 0) {
        char links[600];
        ts_pg_describe_links(pg, links, sizeof links);
        if (o->json) printf("[\n");
        else
            printf("# all_reduce %s sum, %d processes, backend %s\n# rank 0: %s\n# %12s %12s %12s %12s %12s\n",
                   ts_dtype_name(o->dt), ts_pg_size(pg), ts_pg_backend_name(pg), links, "size(B)", "count", "time(us)",
                   "algbw(GB/s)", "busbw(GB/s)");
    }
    ts_tensor *t = NULL; /* --backend nccl: this size's buffer on the GPU */
    int rc = 0;
    bool first = true;
    for (size_t bytes = o->min_bytes; rc == 0 && bytes <= o->max_bytes; bytes *= (size_t)o->step) {
        if (bytes / es == 0) continue;
        rc = time_size(o, pg, gpu, buf, bytes, &t, first);
        first = false;
    }
    if (rank == 0 && o->json) printf("\n]\n");
    fflush(stdout);
    ts_tensor_release(t);
    free(buf);
    ts_pg_free(pg);
    return rc;
}


/* The flags into o (-n is --nprocs): 0 to go on, 1 after --help, 2 after an error (printed). */
static int parse_flags(int argc, char **argv, bench_opts *o) {
    int64_t nprocs = o->nprocs, step = o->step;
    const char *min_b = NULL, *max_b = NULL, *transport = NULL, *dtype = NULL;
    int backend = TS_RUN_BACKEND_BUILTIN;
    const cli_flag flags[] = {
        {"nprocs", CLI_INT, &nprocs, "processes to fork on this host (-n N; under a launcher or mpirun: the job's)", 1, 256},
        {"min-bytes", CLI_STRING, &min_b, "the smallest message, bytes with an optional k, m or g suffix (default 8)", 1, 0},
        {"max-bytes", CLI_STRING, &max_b, "the largest message (default 256m); every rank allocates it", 1, 0},
        {"step", CLI_INT, &step, "the factor between sizes: 2 or 4", 2, 4},
        {"time", CLI_FLOAT, &o->time_s, "seconds of timed calls per size", 1e-6, 3600},
        {"transport", CLI_STRING, &transport, "builtin backend on one host: shm (shared memory, the default) or tcp", 1, 0},
        {"backend", CLI_ENUM, CLI_ENUM_OF(backend, cli_name_back), "builtin, mpi (under mpirun) or nccl (a GPU per rank)", TS_RUN_BACKEND_BUILTIN, TS_RUN_BACKEND_NCCL},
        {"dtype", CLI_STRING, &dtype, "float32 (the default) or bfloat16 (what --ddp-comm bf16 reduces)", 1, 0},
        {"json", CLI_BOOL, &o->json, "print a JSON array, one object per size", 1, 0},
    };
    const cli_command cmd = {"bench allreduce", "tessera bench allreduce [flags]",
                             "All-reduce bandwidth and latency in the style of nccl-tests: in-place sum over N ranks for "
                             "each size from --min-bytes to --max-bytes, printing time, algbw and busbw (algbw x 2(n-1)/n).",
                             flags, (int)(sizeof flags / sizeof flags[0])};
    char *args[256];
    if (argc > 256) return cli_usage_error(&cmd, "too many arguments (%d)", argc);
    for (int i = 0; i < argc; i++) args[i] = strcmp(argv[i], "-n") == 0 ? (char *)"--nprocs" : argv[i];
    int rc = cli_parse(&cmd, argc, args, NULL, 0, NULL);
    if (rc) return rc;
    o->nprocs = (int)nprocs;
    o->step = (int)step;
    o->backend_kind = (ts_run_backend)backend;
    o->backend = ts_run_backend_name(o->backend_kind);
    const char *sizes[2] = {min_b, max_b};
    for (int k = 0; k < 2; k++) {
        bool ok = true;
        if (sizes[k]) *(k ? &o->max_bytes : &o->min_bytes) = parse_bytes(sizes[k], &ok);
        if (!ok)
            return cli_usage_error(&cmd, "--%s '%s' is not a byte count (a number >= 1, optionally with a k, m or g "
                                   "suffix)", k ? "max-bytes" : "min-bytes", sizes[k]);
    }
    if (transport) setenv("TS_DIST_TRANSPORT", transport, 1);
    if (!ts_pg_backend_available(o->backend))
        return cli_usage_error(&cmd, "--backend %s is not built into this Tessera (builtin%s%s)", o->backend,
                               ts_pg_backend_available("mpi") ? ", mpi" : "", ts_pg_backend_available("nccl") ? ", nccl" : "");
    if (dtype && (ts_dtype_parse(dtype, &o->dt) != TS_OK || (o->dt != TS_F32 && o->dt != TS_BF16)))
        return cli_usage_error(&cmd, "--dtype '%s': expected float32 or bfloat16", dtype);
    return 0;
}

/* The values' ranges, and --max-bytes times the ranks on this host within its memory. */
static int check_opts(const bench_opts *o) {
    const char *why = NULL;
    char msg[256];
    long pages = sysconf(_SC_PHYS_PAGES), psize = sysconf(_SC_PAGESIZE);
    double mem = pages > 0 && psize > 0 ? (double)pages * (double)psize : 0;
    int local = o->backend_kind == TS_RUN_BACKEND_MPI ? 1 : o->nprocs; /* under mpirun we only know this rank */
    if (o->nprocs < 1 || o->nprocs > 256)
        snprintf(msg, sizeof msg, "-n %d is out of range [1, 256]", o->nprocs), why = msg;
    else if (o->step != 2 && o->step != 4)
        snprintf(msg, sizeof msg, "--step %d: expected 2 or 4", o->step), why = msg;
    else if (o->max_bytes < o->min_bytes)
        snprintf(msg, sizeof msg, "--max-bytes %zu is below --min-bytes %zu", o->max_bytes, o->min_bytes), why = msg;
    else if (!(o->time_s > 0 && o->time_s <= 3600))
        snprintf(msg, sizeof msg, "--time %g is out of range (0, 3600] seconds", o->time_s), why = msg;
    else if (mem > 0 && (double)o->max_bytes * local > mem)
        snprintf(msg, sizeof msg, "--max-bytes %zu: %d rank%s would allocate %.1f GiB, more than this machine's "
                 "%.1f GiB of memory", o->max_bytes, local, local == 1 ? "" : "s",
                 (double)o->max_bytes * local / 1073741824.0, mem / 1073741824.0), why = msg;
    if (!why) return 0;
    fprintf(stderr, "tessera bench allreduce: %s\n", why);
    return 2;
}

/* N ranks of this program on this host: env:// on 127.0.0.1 and a free port, one job token. */
static int fork_ranks(const bench_opts *o) {
    int port = free_port();
    if (port <= 0) {
        fprintf(stderr, "no free port\n");
        return 1;
    }
    char buf[32];
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    snprintf(buf, sizeof buf, "%d", port);
    setenv("MASTER_PORT", buf, 1);
    snprintf(buf, sizeof buf, "%d", o->nprocs);
    setenv("WORLD_SIZE", buf, 1);
    setenv("LOCAL_WORLD_SIZE", buf, 1);
    char token[TS_JOB_TOKEN_CHARS + 1]; /* the ranks' TCP store and links authenticate with it */
    if (!ts_env_is_set(TS_ENV_JOB_TOKEN)) {
        if (ts_job_token_new(token) != TS_OK) {
            fprintf(stderr, "cannot generate a job token: %s\n", ts_last_error());
            return 1;
        }
        setenv("TS_JOB_TOKEN", token, 1);
    }
    fflush(NULL);
    pid_t pids[256];
    for (int r = 0; r < o->nprocs; r++) {
        pids[r] = fork();
        if (pids[r] < 0) {
            perror("fork");
            return 1;
        }
        if (pids[r] == 0) {
            snprintf(buf, sizeof buf, "%d", r);
            setenv("RANK", buf, 1);
            setenv("LOCAL_RANK", buf, 1);
            _exit(run_rank(o, r));
        }
    }
    int rc = 0;
    for (int r = 0; r < o->nprocs; r++) {
        int st = 0;
        while (waitpid(pids[r], &st, 0) < 0 && errno == EINTR) {}
        if (WIFSIGNALED(st)) {
            fprintf(stderr, "tessera bench allreduce: rank %d (pid %d) was killed by signal %d (%s)%s\n", r,
                    (int)pids[r], WTERMSIG(st), strsignal(WTERMSIG(st)),
                    WTERMSIG(st) == SIGBUS ? ": out of shared memory? (df /dev/shm, TS_DIST_TRANSPORT=tcp)" : "");
            rc = 1;
        } else if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
            fprintf(stderr, "tessera bench allreduce: rank %d exited with status %d\n", r,
                    WIFEXITED(st) ? WEXITSTATUS(st) : -1);
            rc = 1;
        }
    }
    return rc;
}

int ts_bench_allreduce(int argc, char **argv) {
    bench_opts o = {2, 8, 256u << 20, 2, 0.2, false, "builtin", TS_RUN_BACKEND_BUILTIN, TS_F32};
    int rc = parse_flags(argc, argv, &o);
    if (rc) return rc == 1 ? 0 : rc;
    if ((rc = check_opts(&o)) != 0) return rc;
    if (o.backend_kind == TS_RUN_BACKEND_MPI) { /* this process is one of mpirun's ranks */
        const char *r = getenv("OMPI_COMM_WORLD_RANK");
        if (!r) {
            fprintf(stderr, "tessera bench allreduce: --backend mpi runs under mpirun: mpirun -n %d %s\n", o.nprocs,
                    "tessera bench allreduce --backend mpi");
            return 2;
        }
        return run_rank(&o, atoi(r));
    }
    ts_dist_env env; /* under a launcher (tessera run --nnodes, torchrun, srun): this process is one rank */
    bool in_job = false;
    if (ts_dist_env_detect(&env, &in_job) != TS_OK) {
        fprintf(stderr, "tessera bench allreduce: %s\n", ts_last_error());
        return 2;
    }
    return in_job ? run_rank(&o, env.rank) : fork_ranks(&o);
}
