/*
 * distributed/mpi/mpi.c — the "mpi" process-group backend: every collective of
 * backend.h over an MPI library (Debian's OpenMPI 4.1), built when CMake finds
 * MPI (TS_HAVE_MPI). Ranks are MPI_COMM_WORLD's; under plain `mpirun -n N`
 * pg.c needs no MASTER_ADDR (see the top of pg.c) and this backend never
 * touches the store.
 *
 * ---- MPI itself ---------------------------------------------------------------------------------
 * The first group initialises MPI if nobody did (MPI_Init_thread asking for
 * MPI_THREAD_SERIALIZED: pg.c runs operations on its communication thread or
 * inline on the caller) and then finalizes it once at exit (atexit), only if
 * it was us. An application that initialised MPI itself must have asked for
 * MPI_THREAD_SERIALIZED or better, and finalizes it itself. One process-wide
 * mutex serialises every MPI call this file makes (several groups, abort from
 * any thread); it is held for one call at a time, never while waiting, so a
 * slow collective in one group does not block another group. rank/world_size
 * of the group must equal MPI_COMM_WORLD's (an error names both otherwise).
 *
 * ---- Communicators ------------------------------------------------------------------------------
 * Each group MPI_Comm_idup's MPI_COMM_WORLD twice (nonblocking, so a rank that
 * never creates the group is a timeout, not a hang): `comm` carries the
 * collectives and send/recv, `ctl` the abort notices. Both use
 * MPI_ERRORS_RETURN; MPI's error string goes into the ts_error message.
 *
 * ---- Waiting, timeouts, abort -------------------------------------------------------------------
 * Every operation is posted nonblocking (MPI_Iallreduce, MPI_Ibcast,
 * MPI_Ireduce, MPI_Iallgather, MPI_Ireduce_scatter_block, MPI_Ibarrier,
 * MPI_Isend/MPI_Irecv) and polled with MPI_Test: spinning for the first
 * 50 us (MPI progresses only inside MPI calls; latency matters), then
 * yielding the core between tests up to 10 ms, then sleeping 100 us between
 * tests. Between tests it checks the abort flag, the deadline (ctx->timeout_s
 * per call) and every 32 tests whether a peer sent an abort notice. MPI
 * cannot tell which rank is late in a collective, so a collective's timeout
 * says so; send/recv name their peer.
 *
 * Abort notices stand in for the "peer is gone" of the built-in transports:
 * abort() sends a 256-byte notice (group id, rank, reason) to every peer on
 * `ctl`, where each rank keeps one MPI_Irecv posted. A rank that finds a
 * notice fails its operation with TS_ERR_REMOTE naming the aborting rank (it
 * checks before posting each operation, so it never joins a collective its
 * peers abandoned). The group id is rank 0's random 64-bit number, broadcast
 * at init: a notice that reaches a later group whose communicator reused the
 * context id is recognised as stale and ignored. (A rank that dies is not
 * seen by MPI at all; mpirun kills the job when a rank exits abnormally.)
 *
 * MPI cannot cancel a posted collective. After a timeout or abort, the
 * request stays posted: this backend keeps it and never frees that group's
 * communicators (their context ids could otherwise be reused, with stale
 * traffic, by a later group), and MPI may still write into its buffer if
 * peers progress it. A process whose collective failed should not reuse that
 * buffer — in practice it exits, as `tessera train` does. Timed-out
 * send/recv are cancelled (MPI_Cancel) where MPI allows it.
 *
 * ---- Sizes and arguments ------------------------------------------------------------------------
 * MPI counts are int. all_reduce, broadcast, reduce, send and recv are cut
 * into pieces of at most INT_MAX elements (TS_MPI_MAX_COUNT lowers it, for
 * tests), one nonblocking call after the other within the one deadline;
 * all_gather and reduce_scatter with more than that per rank are refused
 * (TS_ERR_UNSUPPORTED). AVG is SUM, then a division by the world size (on
 * the root only for reduce). all_gather copies `in` into its own block of
 * `out` and runs in place (so any aliasing works); reduce_scatter copies an
 * input that overlaps `out`. A receive that gets fewer elements than it
 * expected, or MPI's MPI_ERR_TRUNCATE for more, is TS_ERR_SHAPE naming both
 * ranks. MPI does not check that ranks agree on a collective's size, dtype,
 * op or root; TS_MPI_CHECK=1 adds one small MPI_Iallreduce before each
 * collective that does (TS_ERR_SHAPE / TS_ERR_INVALID_ARG naming both values)
 * at the price of one extra latency per call.
 */
#include "distributed/backend.h"

#include "core/env.h"
#include "core/internal.h"

#include <limits.h>
#include <mpi.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define CPU_RELAX() _mm_pause()
#elif defined(__aarch64__)
#define CPU_RELAX() __asm__ __volatile__("yield")
#else
#define CPU_RELAX() ((void)0)
#endif

#define TAG_NOTICE 1
#define SPIN_S 50e-6
#define YIELD_S 0.01
#define SLEEP_NS 100000L

static const char *const op_names[] = {"sum", "avg", "max", "min"};

/* What abort() tells the peers (fixed size: one MPI_BYTE message). */
typedef struct notice {
    uint64_t id; /* the group's id */
    int32_t rank;
    int32_t pad;
    char reason[240];
} notice;

typedef struct mpib {
    int rank, world;
    double timeout_s, deadline;
    const atomic_int *aborted;
    const char *opname;
    size_t max_count; /* elements per MPI call */
    bool check;       /* TS_MPI_CHECK */
    int tag_ub;
    MPI_Comm comm, ctl;
    uint64_t id;
    MPI_Request ctl_req; /* the posted receive of a peer's notice */
    notice ctl_in;
    notice *ctl_out;        /* this rank's notice (kept until its sends completed) */
    MPI_Request *ctl_sends; /* world entries */
    bool notified;          /* abort() sent the notices (under g_mu) */
    bool peer_aborted;      /* a valid notice arrived */
    bool orphaned;          /* an operation was left posted: never free the communicators */
    bool ready;             /* both communicators exist */
    MPI_Request dup_req[2];
    int64_t check_buf[10]; /* TS_MPI_CHECK's values */
    void *scratch;         /* reduce_scatter's copy of an input left posted */
    struct mpib *next_kept;
} mpib;

/* ---- MPI, process-wide ---------------------------------------------------------------------------- */
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER; /* every MPI call below */
static bool g_initialised_by_us, g_finalized_by_us;
/* States that posted requests may still point into: kept (reachable) until exit. */
static mpib *g_kept;

#define LOCK() pthread_mutex_lock(&g_mu)
#define UNLOCK() pthread_mutex_unlock(&g_mu)

static void finalize_at_exit(void) {
    LOCK();
    int fin = 1;
    MPI_Finalized(&fin);
    if (!fin) MPI_Finalize();
    g_finalized_by_us = true;
    UNLOCK();
}

/* Under g_mu: may MPI still be called? */
static bool mpi_alive(void) {
    int fin = 1;
    if (g_finalized_by_us) return false;
    MPI_Finalized(&fin);
    return !fin;
}

static const char *thread_level_name(int l) {
    return l == MPI_THREAD_SINGLE       ? "MPI_THREAD_SINGLE"
           : l == MPI_THREAD_FUNNELED   ? "MPI_THREAD_FUNNELED"
           : l == MPI_THREAD_SERIALIZED ? "MPI_THREAD_SERIALIZED"
                                        : "MPI_THREAD_MULTIPLE";
}

/* Under g_mu: initialises MPI if nobody did; checks the thread level. */
static ts_status ensure_mpi(void) {
    int init = 0, fin = 0, provided = MPI_THREAD_SINGLE;
    MPI_Initialized(&init);
    MPI_Finalized(&fin);
    if (fin || g_finalized_by_us)
        return ts_error(TS_ERR_STATE, "MPI has already been finalized in this process; the mpi backend needs it");
    if (!init) {
        int rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &provided);
        if (rc != MPI_SUCCESS) {
            char s[MPI_MAX_ERROR_STRING] = "";
            int len = 0;
            MPI_Error_string(rc, s, &len);
            return ts_error(TS_ERR_REMOTE, "MPI_Init_thread failed: %s", s);
        }
        if (!g_initialised_by_us) atexit(finalize_at_exit); /* once: MPI cannot be initialised twice */
        g_initialised_by_us = true;
    } else {
        MPI_Query_thread(&provided);
    }
    if (provided < MPI_THREAD_SERIALIZED)
        return ts_error(TS_ERR_UNSUPPORTED,
                        "MPI provides %s; the mpi backend calls MPI from the process group's communication thread "
                        "and needs MPI_THREAD_SERIALIZED or MPI_THREAD_MULTIPLE (initialise MPI with "
                        "MPI_Init_thread, or let Tessera initialise it)",
                        thread_level_name(provided));
    return TS_OK;
}

/* ---- errors ----------------------------------------------------------------------------------------- */
/* MPI's error string for rc, as a ts_error naming the operation and call (never under g_mu). */
static ts_status mpi_fail(const mpib *b, int rc, const char *call) {
    char s[MPI_MAX_ERROR_STRING] = "";
    int len = 0, cls = MPI_ERR_OTHER;
    LOCK();
    MPI_Error_string(rc, s, &len);
    MPI_Error_class(rc, &cls);
    UNLOCK();
    ts_status st = TS_ERR_REMOTE;
    if (cls == MPI_ERR_TRUNCATE)
        st = TS_ERR_SHAPE;
    else if (cls == MPI_ERR_COUNT || cls == MPI_ERR_TAG || cls == MPI_ERR_RANK || cls == MPI_ERR_TYPE ||
             cls == MPI_ERR_OP || cls == MPI_ERR_ARG || cls == MPI_ERR_ROOT || cls == MPI_ERR_BUFFER)
        st = TS_ERR_INVALID_ARG;
    else if (cls == MPI_ERR_NO_MEM)
        st = TS_ERR_NOMEM;
    return ts_error(st, "%s: %s failed on rank %d: %s", b->opname, call, b->rank, s);
}

/* ---- abort notices ------------------------------------------------------------------------------------ */
/* Under g_mu. Returns true when a notice for this group arrived (b->ctl_in holds it). */
static bool notice_arrived(mpib *b) {
    while (b->ctl_req != MPI_REQUEST_NULL) {
        int done = 0;
        MPI_Status stt;
        if (MPI_Test(&b->ctl_req, &done, &stt) != MPI_SUCCESS || !done) return b->peer_aborted;
        if (b->ctl_in.id == b->id) {
            b->peer_aborted = true;
            return true;
        }
        /* a stale notice of an earlier group (reused context id): listen again */
        b->ctl_req = MPI_REQUEST_NULL;
        MPI_Irecv(&b->ctl_in, (int)sizeof b->ctl_in, MPI_BYTE, MPI_ANY_SOURCE, TAG_NOTICE, b->ctl, &b->ctl_req);
    }
    return b->peer_aborted;
}

static ts_status remote_error(mpib *b) {
    b->ctl_in.reason[sizeof b->ctl_in.reason - 1] = 0;
    return ts_error(TS_ERR_REMOTE, "%s: rank %d aborted the process group: %s", b->opname, (int)b->ctl_in.rank,
                    b->ctl_in.reason);
}

/* Fails when the group was aborted here or by a peer (checked before posting anything). */
static ts_status check_state(mpib *b) {
    if (atomic_load_explicit(b->aborted, memory_order_relaxed))
        return ts_error(TS_ERR_STATE, "%s: the process group was aborted", b->opname);
    LOCK();
    bool alive = mpi_alive(), remote = alive && notice_arrived(b);
    UNLOCK();
    if (!alive) return ts_error(TS_ERR_STATE, "%s: MPI has been finalized", b->opname);
    if (remote) return remote_error(b);
    return TS_OK;
}

/* ---- waiting -------------------------------------------------------------------------------------------- */
/* Polls *req until it completes, the deadline passes, the group is aborted or
 * a peer's notice arrives. peer >= 0: a send/recv with that rank (cancelled
 * on failure); -1: a collective (left posted on failure: b->orphaned). */
static ts_status wait_req(mpib *b, MPI_Request *req, int peer, const char *call, MPI_Status *status) {
    MPI_Status ignore;
    if (!status) status = &ignore;
    double start = 0;
    ts_status st = TS_OK;
    for (unsigned it = 0;; it++) {
        int done = 0, rc;
        bool alive, remote = false;
        LOCK();
        alive = mpi_alive();
        rc = alive ? MPI_Test(req, &done, status) : MPI_SUCCESS;
        if (alive && !done && rc == MPI_SUCCESS && it % 32 == 31 && (remote = notice_arrived(b)))
            rc = MPI_Test(req, &done, status); /* that progress may have completed the operation too */
        UNLOCK();
        if (!alive) return ts_error(TS_ERR_STATE, "%s: MPI has been finalized", b->opname);
        if (rc != MPI_SUCCESS) {
            if (*req != MPI_REQUEST_NULL) b->orphaned = true;
            return mpi_fail(b, rc, call);
        }
        if (done) return TS_OK;
        if (atomic_load_explicit(b->aborted, memory_order_relaxed)) {
            st = ts_error(TS_ERR_STATE, "%s: the process group was aborted", b->opname);
            break;
        }
        if (remote) {
            st = remote_error(b);
            break;
        }
        if (it < 64) {
            CPU_RELAX();
            continue;
        }
        double now = ts_time_now();
        if (start == 0) start = now;
        if (now >= b->deadline) {
            if (peer >= 0)
                st = ts_error(TS_ERR_TIMEOUT, "%s timed out after %g s waiting for rank %d (this rank %d, %s)",
                              b->opname, b->timeout_s, peer, b->rank, call);
            else
                st = ts_error(TS_ERR_TIMEOUT,
                              "%s timed out after %g s on rank %d (%s; MPI cannot tell which of the %d ranks is "
                              "late: one did not make the matching call, or is slower than the timeout)",
                              b->opname, b->timeout_s, b->rank, call, b->world);
            break;
        }
        double idle = now - start;
        if (idle < SPIN_S) {
            CPU_RELAX();
        } else if (idle < YIELD_S) {
            sched_yield();
        } else {
            struct timespec ts = {0, SLEEP_NS};
            nanosleep(&ts, NULL);
        }
    }
    /* Failed while posted. Point-to-point requests can be cancelled; collectives cannot. */
    if (peer >= 0) {
        LOCK();
        if (mpi_alive() && MPI_Cancel(req) == MPI_SUCCESS) {
            double until = ts_time_now() + 0.5;
            int done = 0;
            while (!done && ts_time_now() < until && MPI_Test(req, &done, status) == MPI_SUCCESS) {
                UNLOCK();
                sched_yield();
                LOCK();
            }
        }
        UNLOCK();
    }
    if (*req != MPI_REQUEST_NULL) b->orphaned = true;
    return st;
}

/* ---- helpers -------------------------------------------------------------------------------------------- */
static MPI_Datatype mpi_type(ts_dtype dt) {
    switch (dt) {
    case TS_F32: return MPI_FLOAT;
    case TS_F16:
    case TS_BF16: return MPI_UINT16_T;
    case TS_I64: return MPI_INT64_T;
    case TS_I32: return MPI_INT32_T;
    case TS_U8: return MPI_UINT8_T;
    default: return MPI_DATATYPE_NULL;
    }
}

static MPI_Op mpi_op(ts_reduce_op op) {
    switch (op) {
    case TS_REDUCE_MAX: return MPI_MAX;
    case TS_REDUCE_MIN: return MPI_MIN;
    default: return MPI_SUM;
    }
}

static void divide(float *p, size_t n, int world) {
    float w = (float)world;
    for (size_t i = 0; i < n; i++) p[i] /= w;
}

/* Starts an operation: name, deadline, state and type checks. */
static ts_status begin(mpib *b, ts_coll_kind kind, ts_dtype dt) {
    b->opname = ts_coll_kind_name(kind);
    b->deadline = ts_time_now() + b->timeout_s;
    TS_TRY(check_state(b));
    if (mpi_type(dt) == MPI_DATATYPE_NULL)
        return ts_error(TS_ERR_DTYPE, "%s: dtype %d has no MPI type (rank %d)", b->opname, (int)dt, b->rank);
    return TS_OK;
}

/* The return code of a call posted under g_mu when MPI was already finalized. */
#define RC_DEAD (-1)

/* Waits for the collective request a call (made under g_mu) returned rc for. */
static ts_status posted(mpib *b, int rc, MPI_Request *req, const char *call) {
    if (rc == RC_DEAD) return ts_error(TS_ERR_STATE, "%s: MPI has been finalized", b->opname);
    if (rc != MPI_SUCCESS) return mpi_fail(b, rc, call);
    return wait_req(b, req, -1, call, NULL);
}

/* TS_MPI_CHECK: every rank's (kind, dtype, op, root, count) must agree. One
 * MPI_Iallreduce(MAX) over the values and their negations gives max and min. */
static ts_status agree(mpib *b, ts_coll_kind kind, ts_dtype dt, int op, int root, size_t count) {
    if (!b->check) return TS_OK;
    int64_t *v = b->check_buf; /* in b: a request left posted may still write it */
    int64_t mine[5] = {kind, (int64_t)dt, op, root, (int64_t)count};
    for (int i = 0; i < 5; i++) v[i] = mine[i], v[5 + i] = -mine[i];
    MPI_Request req = MPI_REQUEST_NULL;
    LOCK();
    int rc = mpi_alive() ? MPI_Iallreduce(MPI_IN_PLACE, v, 10, MPI_INT64_T, MPI_MAX, b->comm, &req) : RC_DEAD;
    UNLOCK();
    TS_TRY(posted(b, rc, &req, "MPI_Iallreduce (TS_MPI_CHECK)"));
    int64_t mx[5], mn[5];
    for (int i = 0; i < 5; i++) mx[i] = v[i], mn[i] = -v[5 + i];
    if (mx[0] != mn[0])
        return ts_error(TS_ERR_INVALID_ARG,
                        "collective mismatch: ranks called different collectives (%s and %s; rank %d called %s; "
                        "found by TS_MPI_CHECK, MPI cannot say which rank)",
                        ts_coll_kind_name((ts_coll_kind)mn[0]), ts_coll_kind_name((ts_coll_kind)mx[0]), b->rank,
                        ts_coll_kind_name(kind));
    if (mx[4] != mn[4] || mx[1] != mn[1])
        return ts_error(TS_ERR_SHAPE,
                        "%s: size mismatch: ranks passed between %lld and %lld elements (rank %d passed %zu %s; found "
                        "by TS_MPI_CHECK, MPI cannot say which rank)",
                        b->opname, (long long)mn[4], (long long)mx[4], b->rank, count, ts_dtype_name(dt));
    if (mx[2] != mn[2])
        return ts_error(TS_ERR_INVALID_ARG, "%s: reduce op mismatch: ranks used %s and %s (rank %d: %s)", b->opname,
                        op_names[mn[2] & 3], op_names[mx[2] & 3], b->rank, op_names[op & 3]);
    if (mx[3] != mn[3])
        return ts_error(TS_ERR_INVALID_ARG, "%s: root mismatch: ranks passed roots %lld and %lld (rank %d: %d)",
                        b->opname, (long long)mn[3], (long long)mx[3], b->rank, root);
    return TS_OK;
}

/* ---- lifetime --------------------------------------------------------------------------------------------- */
static uint64_t random_id(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t x = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 30) ^ ((uint64_t)getpid() << 17);
    static _Atomic uint64_t counter;
    x ^= atomic_fetch_add(&counter, 1) * 0x9e3779b97f4a7c15ull;
    x ^= x >> 33; /* splitmix finaliser */
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return x;
}

static ts_status mpi_init_backend(const ts__backend_ctx *ctx, void **state) {
    *state = NULL;
    LOCK();
    ts_status st = ensure_mpi();
    int mrank = -1, msize = -1, *ub = NULL, flag = 0;
    if (st == TS_OK) {
        MPI_Comm_rank(MPI_COMM_WORLD, &mrank);
        MPI_Comm_size(MPI_COMM_WORLD, &msize);
        MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &ub, &flag);
    }
    UNLOCK();
    TS_TRY(st);
    if (mrank != ctx->rank || msize != ctx->world_size)
        return ts_error(TS_ERR_INVALID_ARG,
                        "MPI says this process is rank %d of %d, but the process group has rank %d of world size %d "
                        "(the mpi backend's ranks are MPI_COMM_WORLD's: launch with mpirun -n %d, and leave "
                        "rank/world_size at -1 or give MPI's)",
                        mrank, msize, ctx->rank, ctx->world_size, ctx->world_size);
    mpib *b = ts__calloc(1, sizeof *b);
    if (!b) return TS_ERR_NOMEM;
    b->rank = ctx->rank;
    b->world = ctx->world_size;
    b->timeout_s = ctx->timeout_s;
    b->aborted = ctx->aborted;
    b->opname = "process group init";
    b->tag_ub = flag && ub ? *ub : 32767;
    b->max_count = (size_t)ts_env_int(TS_ENV_MPI_MAX_COUNT); /* in [1, INT_MAX), INT_MAX when unset */
    b->check = ts_env_bool(TS_ENV_MPI_CHECK);
    b->comm = b->ctl = MPI_COMM_NULL;
    b->ctl_req = MPI_REQUEST_NULL;
    b->dup_req[0] = b->dup_req[1] = MPI_REQUEST_NULL;
    b->deadline = ts_time_now() + b->timeout_s;

    /* Two communicators of our own, nonblocking: a rank that never comes is a timeout. */
    LOCK();
    int rc = MPI_Comm_idup(MPI_COMM_WORLD, &b->comm, &b->dup_req[0]);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_idup(MPI_COMM_WORLD, &b->ctl, &b->dup_req[1]);
    UNLOCK();
    if (rc != MPI_SUCCESS) {
        st = mpi_fail(b, rc, "MPI_Comm_idup");
        goto leak;
    }
    for (int i = 0; i < 2; i++) {
        st =
            wait_req(b, &b->dup_req[i], -1, "MPI_Comm_idup of MPI_COMM_WORLD (every rank must create the group)", NULL);
        if (st != TS_OK) goto leak;
    }
    b->ready = true;
    LOCK();
    MPI_Comm_set_errhandler(b->comm, MPI_ERRORS_RETURN);
    MPI_Comm_set_errhandler(b->ctl, MPI_ERRORS_RETURN);
    UNLOCK();
    /* The group's id: rank 0's, so stale notices of an earlier group are recognised. */
    b->id = b->rank == 0 ? random_id() : 0;
    MPI_Request req = MPI_REQUEST_NULL;
    LOCK();
    rc = MPI_Ibcast(&b->id, 1, MPI_UINT64_T, 0, b->ctl, &req);
    UNLOCK();
    if (rc != MPI_SUCCESS) {
        st = mpi_fail(b, rc, "MPI_Ibcast");
        goto leak;
    }
    if ((st = wait_req(b, &req, -1, "MPI_Ibcast of the group id", NULL)) != TS_OK) goto leak;
    b->ctl_out = ts__calloc(1, sizeof *b->ctl_out);
    b->ctl_sends = ts__calloc((size_t)b->world, sizeof *b->ctl_sends);
    if (!b->ctl_out || !b->ctl_sends) {
        st = TS_ERR_NOMEM;
        goto leak;
    }
    for (int i = 0; i < b->world; i++) b->ctl_sends[i] = MPI_REQUEST_NULL;
    LOCK();
    rc = MPI_Irecv(&b->ctl_in, (int)sizeof b->ctl_in, MPI_BYTE, MPI_ANY_SOURCE, TAG_NOTICE, b->ctl, &b->ctl_req);
    UNLOCK();
    if (rc != MPI_SUCCESS) {
        st = mpi_fail(b, rc, "MPI_Irecv");
        goto leak;
    }
    *state = b;
    return TS_OK;
leak:
    /* A pending MPI_Comm_idup/MPI_Ibcast may still point into b: keep it. */
    LOCK();
    b->next_kept = g_kept;
    g_kept = b;
    UNLOCK();
    return st;
}

static void mpi_abort(void *st, const char *reason) {
    mpib *b = st;
    LOCK();
    if (!b->notified && b->ready && mpi_alive()) {
        b->notified = true;
        b->ctl_out->id = b->id;
        b->ctl_out->rank = b->rank;
        snprintf(b->ctl_out->reason, sizeof b->ctl_out->reason, "%s", reason ? reason : "aborted");
        for (int p = 0; p < b->world; p++)
            if (p != b->rank)
                MPI_Isend(b->ctl_out, (int)sizeof *b->ctl_out, MPI_BYTE, p, TAG_NOTICE, b->ctl, &b->ctl_sends[p]);
    }
    UNLOCK();
}

static void mpi_destroy(void *st) {
    mpib *b = st;
    if (!b) return;
    bool keep_notice = false;
    LOCK();
    if (mpi_alive()) {
        bool remote = notice_arrived(b);
        if (b->ctl_req != MPI_REQUEST_NULL) {
            MPI_Cancel(&b->ctl_req);
            MPI_Wait(&b->ctl_req, MPI_STATUS_IGNORE); /* a cancelled receive completes at once */
        }
        /* Let our notices leave (they are small: eager), for a second at most. */
        double until = ts_time_now() + 1.0;
        int all = 0;
        while (b->notified && MPI_Testall(b->world, b->ctl_sends, &all, MPI_STATUSES_IGNORE) == MPI_SUCCESS && !all &&
               ts_time_now() < until) {
            UNLOCK();
            struct timespec ts = {0, SLEEP_NS};
            nanosleep(&ts, NULL);
            LOCK();
        }
        if (b->notified && !all) keep_notice = true; /* MPI may still read it */
        /* Free the communicators only after a clean run: an abort anywhere may leave posted
         * operations and traffic in flight that a reused context id would pick up. */
        if (!b->orphaned && !b->notified && !remote) {
            MPI_Comm_free(&b->comm);
            MPI_Comm_free(&b->ctl);
        }
    }
    if (b->orphaned || keep_notice) { /* a posted request may still use b, its notice or scratch */
        b->next_kept = g_kept;
        g_kept = b;
        UNLOCK();
        return;
    }
    UNLOCK();
    free(b->ctl_out);
    free(b->ctl_sends);
    free(b->scratch);
    free(b);
}

/* ---- collectives --------------------------------------------------------------------------------------------- */
static ts_status mpi_all_reduce(void *st, void *buf, size_t count, ts_dtype dt, ts_reduce_op op) {
    mpib *b = st;
    TS_TRY(begin(b, TS_COLL_ALL_REDUCE, dt));
    TS_TRY(agree(b, TS_COLL_ALL_REDUCE, dt, op, -1, count));
    size_t es = ts_dtype_size(dt);
    for (size_t off = 0; off < count; off += b->max_count) {
        size_t n = TS_MIN(count - off, b->max_count);
        MPI_Request req = MPI_REQUEST_NULL;
        LOCK();
        int rc = mpi_alive() ? MPI_Iallreduce(MPI_IN_PLACE, (char *)buf + off * es, (int)n, mpi_type(dt), mpi_op(op),
                                              b->comm, &req)
                             : RC_DEAD;
        UNLOCK();
        TS_TRY(posted(b, rc, &req, "MPI_Iallreduce"));
    }
    if (op == TS_REDUCE_AVG) divide(buf, count, b->world);
    return TS_OK;
}

static ts_status mpi_broadcast(void *st, void *buf, size_t count, ts_dtype dt, int root) {
    mpib *b = st;
    TS_TRY(begin(b, TS_COLL_BROADCAST, dt));
    TS_TRY(agree(b, TS_COLL_BROADCAST, dt, 0, root, count));
    size_t es = ts_dtype_size(dt);
    for (size_t off = 0; off < count; off += b->max_count) {
        size_t n = TS_MIN(count - off, b->max_count);
        MPI_Request req = MPI_REQUEST_NULL;
        LOCK();
        int rc = mpi_alive() ? MPI_Ibcast((char *)buf + off * es, (int)n, mpi_type(dt), root, b->comm, &req) : RC_DEAD;
        UNLOCK();
        TS_TRY(posted(b, rc, &req, "MPI_Ibcast"));
    }
    return TS_OK;
}

static ts_status mpi_reduce(void *st, void *buf, size_t count, ts_dtype dt, ts_reduce_op op, int root) {
    mpib *b = st;
    TS_TRY(begin(b, TS_COLL_REDUCE, dt));
    TS_TRY(agree(b, TS_COLL_REDUCE, dt, op, root, count));
    size_t es = ts_dtype_size(dt);
    bool me = b->rank == root;
    for (size_t off = 0; off < count; off += b->max_count) {
        size_t n = TS_MIN(count - off, b->max_count);
        char *p = (char *)buf + off * es;
        MPI_Request req = MPI_REQUEST_NULL;
        LOCK();
        int rc = mpi_alive() ? MPI_Ireduce(me ? MPI_IN_PLACE : p, me ? p : NULL, (int)n, mpi_type(dt), mpi_op(op), root,
                                           b->comm, &req)
                             : RC_DEAD;
        UNLOCK();
        TS_TRY(posted(b, rc, &req, "MPI_Ireduce"));
    }
    if (op == TS_REDUCE_AVG && me) divide(buf, count, b->world);
    return TS_OK;
}

static ts_status too_big(mpib *b, size_t count) {
    return ts_error(TS_ERR_UNSUPPORTED,
                    "%s: %zu elements per rank exceed what one MPI call takes (%zu; MPI counts are int) - the mpi "
                    "backend does not split %s; use smaller tensors or the builtin backend",
                    b->opname, count, b->max_count, b->opname);
}

static ts_status mpi_all_gather(void *st, void *out, const void *in, size_t count, ts_dtype dt) {
    mpib *b = st;
    b->opname = ts_coll_kind_name(TS_COLL_ALL_GATHER);
    if (count > b->max_count) return too_big(b, count); /* an argument error: before anything else */
    TS_TRY(begin(b, TS_COLL_ALL_GATHER, dt));
    TS_TRY(agree(b, TS_COLL_ALL_GATHER, dt, 0, -1, count));
    if (count == 0) return TS_OK;
    size_t bytes = count * ts_dtype_size(dt);
    char *mine = (char *)out + (size_t)b->rank * bytes;
    if (mine != in) memmove(mine, in, bytes);
    MPI_Request req = MPI_REQUEST_NULL;
    LOCK();
    int rc = mpi_alive()
                 ? MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, out, (int)count, mpi_type(dt), b->comm, &req)
                 : RC_DEAD;
    UNLOCK();
    TS_TRY(posted(b, rc, &req, "MPI_Iallgather"));
    return TS_OK;
}

static ts_status mpi_reduce_scatter(void *st, void *out, const void *in, size_t count, ts_dtype dt, ts_reduce_op op) {
    mpib *b = st;
    b->opname = ts_coll_kind_name(TS_COLL_REDUCE_SCATTER);
    if (count > b->max_count) return too_big(b, count); /* an argument error: before anything else */
    TS_TRY(begin(b, TS_COLL_REDUCE_SCATTER, dt));
    TS_TRY(agree(b, TS_COLL_REDUCE_SCATTER, dt, op, -1, count));
    if (count == 0) return TS_OK;
    size_t es = ts_dtype_size(dt), in_bytes = count * es * (size_t)b->world;
    const char *src = in, *o = out;
    void *copy = NULL;
    if (o < src + in_bytes && src < o + count * es) { /* MPI forbids overlapping buffers */
        if (!(copy = ts__malloc(in_bytes))) return TS_ERR_NOMEM;
        memcpy(copy, in, in_bytes);
        src = copy;
    }
    MPI_Request req = MPI_REQUEST_NULL;
    LOCK();
    int rc = mpi_alive() ? MPI_Ireduce_scatter_block(src, out, (int)count, mpi_type(dt), mpi_op(op), b->comm, &req)
                         : RC_DEAD;
    UNLOCK();
    ts_status s = posted(b, rc, &req, "MPI_Ireduce_scatter_block");
    if (copy && s != TS_OK && b->orphaned) b->scratch = copy; /* a posted request may still read it */
    else free(copy);
    TS_TRY(s);
    if (op == TS_REDUCE_AVG) divide(out, count, b->world);
    return TS_OK;
}

static ts_status mpi_barrier(void *st) {
    mpib *b = st;
    TS_TRY(begin(b, TS_COLL_BARRIER, TS_F32));
    TS_TRY(agree(b, TS_COLL_BARRIER, TS_F32, 0, -1, 0));
    MPI_Request req = MPI_REQUEST_NULL;
    LOCK();
    int rc = mpi_alive() ? MPI_Ibarrier(b->comm, &req) : RC_DEAD;
    UNLOCK();
    TS_TRY(posted(b, rc, &req, "MPI_Ibarrier"));
    return TS_OK;
}

/* ---- point to point -------------------------------------------------------------------------------------------- */
static ts_status check_tag(mpib *b, int tag) {
    if (tag < 0 || tag > b->tag_ub)
        return ts_error(TS_ERR_INVALID_ARG, "%s: tag %d is outside MPI's range 0..%d (rank %d)", b->opname, tag,
                        b->tag_ub, b->rank);
    return TS_OK;
}

/* count elements in pieces of at most max_count (a zero-length message when count is 0). */
static ts_status mpi_send(void *st, const void *buf, size_t count, ts_dtype dt, int dst, int tag) {
    mpib *b = st;
    b->opname = ts_coll_kind_name(TS_COLL_SEND);
    TS_TRY(check_tag(b, tag)); /* an argument error: before anything else */
    TS_TRY(begin(b, TS_COLL_SEND, dt));
    size_t es = ts_dtype_size(dt), off = 0;
    do {
        size_t n = TS_MIN(count - off, b->max_count);
        MPI_Request req = MPI_REQUEST_NULL;
        LOCK();
        int rc = mpi_alive() ? MPI_Isend((const char *)buf + off * es, (int)n, mpi_type(dt), dst, tag, b->comm, &req)
                             : RC_DEAD;
        UNLOCK();
        if (rc == RC_DEAD) return ts_error(TS_ERR_STATE, "%s: MPI has been finalized", b->opname);
        if (rc != MPI_SUCCESS) return mpi_fail(b, rc, "MPI_Isend");
        TS_TRY(wait_req(b, &req, dst, "MPI_Isend", NULL));
        off += n;
    } while (off < count);
    return TS_OK;
}

static ts_status mpi_recv(void *st, void *buf, size_t count, ts_dtype dt, int src, int tag) {
    mpib *b = st;
    b->opname = ts_coll_kind_name(TS_COLL_RECV);
    TS_TRY(check_tag(b, tag)); /* an argument error: before anything else */
    TS_TRY(begin(b, TS_COLL_RECV, dt));
    size_t es = ts_dtype_size(dt), off = 0;
    do {
        size_t n = TS_MIN(count - off, b->max_count);
        MPI_Request req = MPI_REQUEST_NULL;
        MPI_Status stt;
        LOCK();
        int rc =
            mpi_alive() ? MPI_Irecv((char *)buf + off * es, (int)n, mpi_type(dt), src, tag, b->comm, &req) : RC_DEAD;
        UNLOCK();
        if (rc == RC_DEAD) return ts_error(TS_ERR_STATE, "%s: MPI has been finalized", b->opname);
        if (rc != MPI_SUCCESS) return mpi_fail(b, rc, "MPI_Irecv");
        ts_status s = wait_req(b, &req, src, "MPI_Irecv", &stt);
        if (s == TS_ERR_SHAPE) {
            char why[256];
            snprintf(why, sizeof why, "%s", ts_last_error());
            return ts_error(TS_ERR_SHAPE,
                            "recv: size mismatch: rank %d sent more than the %zu %s elements rank %d (this rank) "
                            "expected with tag %d (%s)",
                            src, count, ts_dtype_name(dt), b->rank, tag, why);
        }
        TS_TRY(s);
        int got = 0;
        LOCK();
        MPI_Get_count(&stt, mpi_type(dt), &got);
        UNLOCK();
        if ((size_t)got != n)
            return ts_error(TS_ERR_SHAPE,
                            "recv: size mismatch: rank %d sent %zu %s elements, rank %d (this rank) expected %zu "
                            "with tag %d",
                            src, off + (size_t)got, ts_dtype_name(dt), b->rank, count, tag);
        off += n;
    } while (off < count);
    return TS_OK;
}

const ts__backend_ops ts__mpi_backend = {
    .name = "mpi",
    .init = mpi_init_backend,
    .all_reduce = mpi_all_reduce,
    .broadcast = mpi_broadcast,
    .reduce = mpi_reduce,
    .all_gather = mpi_all_gather,
    .reduce_scatter = mpi_reduce_scatter,
    .barrier = mpi_barrier,
    .send = mpi_send,
    .recv = mpi_recv,
    .abort = mpi_abort,
    .destroy = mpi_destroy,
    .joins_without_store = true,
};
