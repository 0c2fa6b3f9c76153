/*
 * distributed/pg.c — process groups: rendezvous, backend selection, the per-group
 * communication thread and its FIFO of work, timeouts and abort, and the
 * argument checks of every collective.
 *
 * Execution model. Collectives must run in the same order on every rank, so
 * each group runs them one at a time in issue order: asynchronous calls
 * (work != NULL) append a ts_work to the group's queue, which a communication
 * thread (started on first use) drains; a blocking call whose queue is empty
 * and idle runs the backend inline on the caller's thread (no thread hop: this
 * is what keeps a 4 KiB all-reduce in the microseconds), otherwise it queues
 * and waits like ts_work_wait. Backends run one operation at a time and bound
 * each by the group's timeout.
 *
 * Failure model. A backend error (peer gone, timeout, ranks disagreeing about
 * a collective) leaves the ranks out of step, so it aborts the group: the
 * backend closes its connections (peers see this rank as gone, with the
 * reason), and every later call fails fast with the first error's status and
 * "process group '<name>' was aborted: <reason>". ts_work_wait with a timeout
 * that expires does the same with TS_ERR_TIMEOUT naming the op and seconds.
 * Argument errors are found before anything is queued and abort nothing.
 *
 * Liveness. Each group records its operations in a flight recorder
 * (flight.c: issued when called, started when the backend takes it, completed
 * or failed) and, with more than one rank and a shared store, runs a
 * heartbeat thread (heartbeat.c, started before the backend connects) that
 * aborts the group when a peer the running operation waits on has been silent
 * for the heartbeat timeout. The first abort of a group, whatever its cause,
 * writes the failure report for the launcher (TS_RUN_DIR) and logs the flight
 * recorder before it sets the abort flag and tells the backend, so that by the
 * time a peer can see this rank fail, its report is on disk.
 *
 * Rendezvous under mpirun. Backend "mpi" with no store, init_method NULL or
 * "env://" and no MASTER_ADDR in the environment (plain `mpirun -n N prog`)
 * skips the store-based join: the MPI backend never uses the store, and MPI
 * itself is the rendezvous (the backend checks MPI's rank and size against
 * the group's). rank/world_size (and local ones) come from the options, else
 * the launcher's variables (env.c: OMPI_COMM_WORLD_*, or SLURM_* under srun),
 * else 0 of 1 (a singleton MPI process); the store is a private in-process
 * memory store joined as a group of one (mpi_rendezvous below). With
 * MASTER_ADDR set, or a store or tcp:// / file:// init method, the usual join
 * runs first for "mpi" as for every backend.
 */
#include "distributed/pg.h"

#include "core/internal.h"
#include "distributed/flight.h"
#include "distributed/heartbeat.h"
#include "distributed/rendezvous.h"
#include "tensor/tensor.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

/* Every backend name this library knows, built in or not (ops NULL): the one place a name from
 * ts_pg_options.backend is looked up; everything after goes by the table's capability flags. */
static const struct backend_name {
    const char *name;
    const ts__backend_ops *ops;
} backends[] = {
    {"builtin", &ts__builtin_backend},
#ifdef TS_HAVE_MPI
    {"mpi", &ts__mpi_backend},
#else
    {"mpi", NULL},
#endif
#ifdef TS_HAVE_NCCL
    {"nccl", &ts__nccl_backend},
#else
    {"nccl", NULL},
#endif
    {"gloo", NULL}, /* torch's CPU backend: the builtin one does its work here */
};

#define MAX_BEHIND 64 /* ranks a failure report lists as behind */

struct ts_work {
    atomic_int refs; /* the caller's handle + the queue */
    ts_process_group *pg;
    ts_coll_kind kind;
    void *buf;
    const void *in;
    size_t count;
    ts_dtype dt;
    ts_reduce_op op;
    int arg; /* root, peer */
    int tag;
    ts_tensor *hold[2]; /* kept alive until completion */
    uint64_t id;
    uint64_t fid; /* its flight recorder entry */
    ts_work *next;

    pthread_mutex_t mu;
    pthread_cond_t cv;
    atomic_bool done;
    ts_status status;
    char msg[512];
};

struct ts_process_group {
    char *name;
    ts_store *store;
    int rank, world, local_rank, local_world;
    double timeout_s;
    const ts__backend_ops *be;
    void *be_state;
    ts__backend_ctx ctx;

    atomic_int aborted;
    pthread_mutex_t abort_mu;
    bool failing; /* an abort is being reported (under abort_mu) */
    ts_status abort_status;
    char abort_reason[1024];

    ts__flight fr;
    ts__heartbeat *hb;
    double hb_timeout_s; /* 0: no heartbeats */
    char host[64];

    pthread_mutex_t mu; /* the queue */
    pthread_cond_t cv;
    ts_work *head, *tail;
    bool running, stop, has_thread;
    pthread_t thread;
    uint64_t next_id;
};

static void heartbeat_failed(void *user, ts_status st, const char *reason, const ts__hb_blame *blame);
static ts_status aborted_error(ts_process_group *pg, const char *what);

/* The table entry named name (NULL: "builtin"), or NULL when the name is unknown. */
static const struct backend_name *backend_named(const char *name) {
    if (!name) name = "builtin";
    for (size_t i = 0; i < TS_ARRAY_LEN(backends); i++)
        if (strcmp(backends[i].name, name) == 0) return &backends[i];
    return NULL;
}

bool ts_pg_backend_available(const char *name) {
    const struct backend_name *b = name ? backend_named(name) : NULL;
    return b && b->ops;
}

/* ---- group lifetime --------------------------------------------------------------------------- */
static ts_status find_backend(const char *name, const ts__backend_ops **out) {
    const struct backend_name *b = backend_named(name);
    if (b && b->ops) {
        *out = b->ops;
        return TS_OK;
    }
    char avail[128] = "";
    for (size_t i = 0; i < TS_ARRAY_LEN(backends); i++)
        if (backends[i].ops)
            snprintf(avail + strlen(avail), sizeof avail - strlen(avail), "%s%s", avail[0] ? ", " : "",
                     backends[i].name);
    if (b)
        return ts_error(TS_ERR_UNSUPPORTED, "process group backend '%s' is not built into this Tessera (available: %s)",
                        b->name, avail);
    return ts_error(TS_ERR_INVALID_ARG, "unknown process group backend '%s' (available: %s)", name, avail);
}

ts_status ts_pg_backend_caps_get(const char *name, ts_pg_backend_caps *out) {
    TS_ARG(out, "ts_pg_backend_caps_get: out is NULL");
    const ts__backend_ops *be = NULL;
    TS_TRY(find_backend(name, &be));
    *out = (ts_pg_backend_caps){be->reduces_bf16, be->device_buffers, be->joins_without_store};
    return TS_OK;
}

/* A backend that joins without a store ("mpi") under plain mpirun: see "Rendezvous under mpirun" at the top. */
static bool mpi_without_store(const ts_pg_options *opts, const ts__backend_ops *be) {
    const char *addr = getenv("MASTER_ADDR");
    return be->joins_without_store && !opts->store &&
           (!opts->init_method || strcmp(opts->init_method, "env://") == 0) && !(addr && addr[0]);
}

static ts_status mpi_rendezvous(const ts_pg_options *opts, ts_process_group *pg) {
    ts_dist_env env;
    TS_TRY(ts__dist_env_read(&env, 0));
    int r = opts->rank >= 0 ? opts->rank : env.rank, w = opts->world_size >= 0 ? opts->world_size : env.world_size;
    int lr = opts->local_rank >= 0 ? opts->local_rank : env.local_rank;
    int lw = opts->local_world_size >= 0 ? opts->local_world_size : env.local_world_size;
    if (w < 0) w = 1;
    if (r < 0) r = 0;
    if (lr < 0 || lw < 0) { /* no launcher said: one host (the backend checks rank and size against MPI's) */
        lr = r;
        lw = w;
    }
    ts_store *mem = NULL;
    TS_TRY(ts_store_memory_new(&mem));
    ts_pg_options o = *opts;
    o.store = mem;
    o.rank = 0;
    o.world_size = 1;
    o.local_rank = 0;
    o.local_world_size = 1;
    int r1, w1, lr1, lw1;
    ts_status st = ts__rendezvous(&o, &pg->store, &r1, &w1, &lr1, &lw1, &pg->timeout_s);
    ts_store_release(mem);
    TS_TRY(st);
    pg->rank = r;
    pg->world = w;
    pg->local_rank = lr;
    pg->local_world = lw;
    return TS_OK;
}

/* Heartbeats for a group without a shared store: every rank's address through
 * one all_gather of the connected backend. A rank that cannot open its socket
 * still takes part (an empty entry: its peers never judge it). */
static ts_status heartbeat_by_backend(ts_process_group *pg, double timeout_s) {
    ts__heartbeat *hb = NULL;
    char mine[TS__HB_ADDR_BYTES] = "";
    if (ts__heartbeat_new(pg->rank, pg->world, timeout_s, &pg->fr, heartbeat_failed, pg, &hb) == TS_OK)
        snprintf(mine, sizeof mine, "%s", ts__heartbeat_address(hb));
    else
        ts_log(TS_LOG_WARN, "process group '%s', rank %d: no heartbeats: %s", pg->name, pg->rank, ts_last_error());
    char *all = ts__calloc((size_t)pg->world, TS__HB_ADDR_BYTES);
    ts_status st = all ? pg->be->all_gather(pg->be_state, all, mine, TS__HB_ADDR_BYTES, TS_U8) : TS_ERR_NOMEM;
    if (st == TS_OK && hb) {
        ts__heartbeat_peers_from_table(hb, all);
        st = ts__heartbeat_run(hb);
    }
    free(all);
    if (st != TS_OK || !hb) {
        ts__heartbeat_stop(hb);
        return st == TS_OK ? TS_OK : ts__error_prefix(st, "exchanging heartbeat addresses");
    }
    pg->hb = hb;
    pg->hb_timeout_s = timeout_s;
    return TS_OK;
}

ts_status ts_pg_new(const ts_pg_options *opts, ts_process_group **out) {
    TS_ARG(out, "ts_pg_new: out is NULL");
    *out = NULL;
    const ts__backend_ops *be = NULL;
    bool opts_ok = opts && opts->size >= sizeof(ts_pg_options) && opts->magic == TS_PG_OPTIONS_MAGIC;
    TS_TRY(find_backend(opts_ok ? opts->backend : NULL, &be));
    double hb_timeout = 0;
    TS_TRY(ts__heartbeat_resolve_timeout(opts_ok ? opts->heartbeat_timeout_s : 0.0, &hb_timeout));

    ts_device *device = NULL; /* the group's device: named in the options, else the backend's choice */
    if (opts_ok && opts->version >= 2 && opts->device && ts_device_get(opts->device, &device) != TS_OK)
        return ts__error_prefix(TS_ERR_DEVICE, "ts_pg_new: device '%s'", opts->device);
    ts_process_group *pg = ts__calloc(1, sizeof *pg);
    if (!pg) return TS_ERR_NOMEM;
    bool private_store = opts_ok && mpi_without_store(opts, be);
    ts_status st = private_store ? mpi_rendezvous(opts, pg)
                                 : ts__rendezvous(opts, &pg->store, &pg->rank, &pg->world, &pg->local_rank,
                                                  &pg->local_world, &pg->timeout_s);
    if (st != TS_OK) {
        free(pg);
        return st;
    }
    ts__launched_setup(pg->local_world); /* a launched rank's CPU share and line-buffered stdout */
    if (!device && be->device_buffers) { /* torchrun's convention: local rank r on cuda:r */
        char dn[32];
        snprintf(dn, sizeof dn, "cuda:%d", pg->local_rank > 0 ? pg->local_rank : 0);
        if (ts_device_get(dn, &device) != TS_OK) {
            st = ts__error_prefix(TS_ERR_DEVICE, "process group (backend %s, rank %d, local rank %d): its GPU", be->name,
                                  pg->rank, pg->local_rank);
            ts_store_release(pg->store);
            free(pg);
            return st;
        }
    }
    ts__flight_init(&pg->fr);
    snprintf(pg->host, sizeof pg->host, "localhost");
    gethostname(pg->host, sizeof pg->host - 1);
    pg->name = ts__strdup(opts_ok && opts->group_name ? opts->group_name : "default");
    pg->be = be;
    pthread_mutex_init(&pg->mu, NULL);
    pthread_mutex_init(&pg->abort_mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&pg->cv, &ca);
    pthread_condattr_destroy(&ca);
    atomic_init(&pg->aborted, 0);
    pg->ctx = (ts__backend_ctx){pg->store,     pg->rank,     pg->world, pg->local_rank, pg->local_world,
                                pg->timeout_s, pg->name ? pg->name : "default", &pg->aborted, device};
    if (!pg->name) {
        st = TS_ERR_NOMEM;
    } else {
        /* Heartbeats start before the backend connects, through the store (see heartbeat.c) */
        if (pg->world > 1 && hb_timeout > 0 && !private_store) {
            st = ts__heartbeat_start(pg->store, pg->rank, pg->world, hb_timeout, &pg->fr, heartbeat_failed, pg,
                                     &pg->hb);
            if (st == TS_OK) pg->hb_timeout_s = hb_timeout;
        }
        if (st == TS_OK) { /* recorded: a peer that stops while the backend connects is named too */
            uint64_t fid = ts__flight_issue(&pg->fr, TS_COLL_INIT, TS_U8, -1, 0, -1, false, true);
            st = be->init(&pg->ctx, &pg->be_state);
            ts__flight_end(&pg->fr, fid, st == TS_OK);
            if (st != TS_OK && atomic_load(&pg->aborted)) st = aborted_error(pg, "setup");
        }
        /* ... or, with no store to share (plain mpirun), through the backend once it is connected */
        if (st == TS_OK && pg->world > 1 && hb_timeout > 0 && private_store) st = heartbeat_by_backend(pg, hb_timeout);
        if (st != TS_OK) st = ts__error_prefix(st, "process group '%s' (backend %s)", pg->name, be->name);
    }
    if (st != TS_OK) {
        pg->be = NULL;
        ts_pg_free(pg);
        return st;
    }
    *out = pg;
    return TS_OK;
}

void ts_pg_free(ts_process_group *pg) {
    if (!pg) return;
    pthread_mutex_lock(&pg->mu);
    pg->stop = true;
    pthread_cond_broadcast(&pg->cv);
    bool joinable = pg->has_thread;
    pthread_mutex_unlock(&pg->mu);
    if (joinable) pthread_join(pg->thread, NULL); /* queued work waiting on a silent peer still fails */
    ts__heartbeat_stop(pg->hb);                  /* before the backend goes: it may abort the group */
    pg->hb = NULL;
    if (pg->be && pg->be_state) pg->be->destroy(pg->be_state);
    ts_store_release(pg->store);
    pthread_cond_destroy(&pg->cv);
    pthread_mutex_destroy(&pg->mu);
    pthread_mutex_destroy(&pg->abort_mu);
    ts__flight_destroy(&pg->fr);
    free(pg->name);
    free(pg);
}

int ts_pg_rank(const ts_process_group *pg) { return pg ? pg->rank : -1; }
int ts_pg_size(const ts_process_group *pg) { return pg ? pg->world : 0; }
int ts_pg_local_rank(const ts_process_group *pg) { return pg ? pg->local_rank : -1; }
const char *ts_pg_backend_name(const ts_process_group *pg) { return pg && pg->be ? pg->be->name : ""; }
bool ts_pg_reduces_dtype(const ts_process_group *pg, ts_dtype dt) {
    return pg && pg->be && (dt == TS_F32 || (dt == TS_BF16 && pg->be->reduces_bf16));
}
double ts_pg_timeout(const ts_process_group *pg) { return pg ? pg->timeout_s : 0.0; }
const char *ts__pg_name(const ts_process_group *pg) { return pg ? pg->name : ""; }
ts_device *ts__pg_device(const ts_process_group *pg) {
    return pg && pg->be && pg->be->device_buffers ? pg->ctx.device : NULL;
}
bool ts__pg_aborted(const ts_process_group *pg) { return pg && atomic_load(&pg->aborted); }

void ts_pg_describe_links(const ts_process_group *pg, char *buf, size_t n) {
    if (!buf || !n) return;
    buf[0] = 0;
    if (pg && pg->be && pg->be->describe && pg->be_state) pg->be->describe(pg->be_state, buf, n);
    if (!buf[0]) snprintf(buf, n, "%s backend", pg && pg->be ? pg->be->name : "no");
}
double ts_pg_heartbeat_timeout(const ts_process_group *pg) { return pg ? pg->hb_timeout_s : 0.0; }
void ts__pg_heartbeat_pause(ts_process_group *pg, bool paused) {
    if (pg) ts__heartbeat_pause(pg->hb, paused);
}

ts_status ts_pg_flight_recorder(const ts_process_group *pg, ts_pg_op_record *out, int cap, int *n) {
    TS_ARG(n, "ts_pg_flight_recorder: n is NULL");
    *n = 0;
    TS_ARG(pg, "ts_pg_flight_recorder: process group is NULL");
    TS_ARG(cap >= 0 && (out || cap == 0), "ts_pg_flight_recorder: out is NULL with cap %d", cap);
    *n = ts__flight_snapshot((ts__flight *)&pg->fr, out, cap); /* the recorder has its own mutex */
    return TS_OK;
}

static bool is_collective(const ts_pg_op_record *op) {
    return op->kind != TS_COLL_INIT && !ts_coll_kind_is_p2p(op->kind);
}

/* Peers whose last heartbeat said they had not started collective op (none for send/recv). */
static int behind_of(ts_process_group *pg, const ts_pg_op_record *op, int *behind) {
    return op && is_collective(op) ? ts__heartbeat_behind(pg->hb, op->seq, behind, MAX_BEHIND) : 0;
}

/* "; by their last heartbeats rank(s) 1, 3 had not started it", or "". */
static void behind_note(ts_process_group *pg, const ts_pg_op_record *op, char *buf, size_t n) {
    int behind[MAX_BEHIND], nb = behind_of(pg, op, behind);
    buf[0] = 0;
    for (int i = 0; i < nb && strlen(buf) + 16 < n; i++)
        snprintf(buf + strlen(buf), n - strlen(buf), "%s%d", i ? ", " : "; by their last heartbeats rank(s) ",
                 behind[i]);
    if (nb) snprintf(buf + strlen(buf), n - strlen(buf), " had not started it");
}

/* The first abort of a group: report (TS_RUN_DIR), log the flight recorder,
 * then set the flag and tell the backend (so peers learn of it only after the
 * report exists). Later aborts wait until the first one has set the flag.
 * op: the operation that failed (NULL: the one running now, if any); blame:
 * the silent peer, if one is known. */
static void pg_fail(ts_process_group *pg, ts_status status, const char *reason, ts__fail_cause cause,
                    const ts__hb_blame *blame, const ts_pg_op_record *op) {
    pthread_mutex_lock(&pg->abort_mu);
    if (pg->failing) {
        pthread_mutex_unlock(&pg->abort_mu);
        while (!atomic_load(&pg->aborted)) { /* the first abort is writing its report: a millisecond */
            struct timespec ts = {0, 100 * 1000};
            nanosleep(&ts, NULL);
        }
        return;
    }
    pg->failing = true;
    pg->abort_status = status;
    snprintf(pg->abort_reason, sizeof pg->abort_reason, "%s", reason && *reason ? reason : "ts_pg_abort");
    pthread_mutex_unlock(&pg->abort_mu);

    ts__fail_info fi;
    memset(&fi, 0, sizeof fi);
    fi.group = pg->name;
    fi.host = pg->host;
    fi.rank = pg->rank;
    fi.world = pg->world;
    fi.pid = (int)getpid();
    fi.status = status;
    fi.cause = cause;
    fi.reason = pg->abort_reason;
    fi.blame_rank = -1;
    if (blame) {
        fi.blame_rank = blame->rank;
        fi.blame_pid = blame->pid;
        fi.blame_host = blame->host;
        fi.silent_s = blame->silent_s;
        fi.blame_started = blame->started;
        fi.blame_completed = blame->completed;
    }
    ts_pg_op_record cur;
    if (!op && ts__flight_current(&pg->fr, &cur)) op = &cur;
    int behind[MAX_BEHIND];
    fi.op = op;
    fi.nbehind = behind_of(pg, op, behind);
    fi.behind = behind;
    ts__flight_report(&pg->fr, &fi);
    ts__flight_dump(&pg->fr, &fi);

    atomic_store(&pg->aborted, 1);
    if (pg->be && pg->be_state) pg->be->abort(pg->be_state, pg->abort_reason);
    pthread_mutex_lock(&pg->mu);
    pthread_cond_broadcast(&pg->cv);
    pthread_mutex_unlock(&pg->mu);
}

void ts__pg_abort_status(ts_process_group *pg, ts_status status, const char *reason) {
    if (!pg) return;
    pg_fail(pg, status, reason,
            status == TS_ERR_TIMEOUT ? TS__CAUSE_TIMEOUT
            : status == TS_ERR_STATE ? TS__CAUSE_ABORT
                                     : TS__CAUSE_ERROR,
            NULL, NULL);
}

void ts_pg_abort(ts_process_group *pg, const char *reason) { ts__pg_abort_status(pg, TS_ERR_STATE, reason); }

/* The heartbeat thread's verdict on a silent peer. */
static void heartbeat_failed(void *user, ts_status st, const char *reason, const ts__hb_blame *blame) {
    pg_fail(user, st, reason, TS__CAUSE_HEARTBEAT, blame, &blame->op);
}

static ts_status aborted_error(ts_process_group *pg, const char *what) {
    pthread_mutex_lock(&pg->abort_mu);
    ts_status st = ts_error(pg->abort_status, "%s: process group '%s' was aborted: %s", what, pg->name,
                            pg->abort_reason);
    pthread_mutex_unlock(&pg->abort_mu);
    return st;
}

/* ---- running work -------------------------------------------------------------------------------- */
/* Runs w on the calling thread; fills w->status and w->msg. */
static void execute(ts_process_group *pg, ts_work *w) {
    ts_status st;
    if (atomic_load(&pg->aborted)) {
        st = aborted_error(pg, ts_coll_kind_name(w->kind));
        ts__flight_end(&pg->fr, w->fid, false);
    } else {
        ts__flight_start(&pg->fr, w->fid); /* a no-op when submit recorded it as started */
        void *s = pg->be_state;
        const ts__backend_ops *be = pg->be;
        switch (w->kind) {
        case TS_COLL_ALL_REDUCE: st = be->all_reduce(s, w->buf, w->count, w->dt, w->op); break;
        case TS_COLL_BROADCAST: st = be->broadcast(s, w->buf, w->count, w->dt, w->arg); break;
        case TS_COLL_REDUCE: st = be->reduce(s, w->buf, w->count, w->dt, w->op, w->arg); break;
        case TS_COLL_ALL_GATHER: st = be->all_gather(s, w->buf, w->in, w->count, w->dt); break;
        case TS_COLL_REDUCE_SCATTER: st = be->reduce_scatter(s, w->buf, w->in, w->count, w->dt, w->op); break;
        case TS_COLL_BARRIER: st = be->barrier(s); break;
        case TS_COLL_SEND: st = be->send(s, w->in, w->count, w->dt, w->arg, w->tag); break;
        case TS_COLL_RECV: st = be->recv(s, w->buf, w->count, w->dt, w->arg, w->tag); break;
        default: st = ts_error(TS_ERR_INTERNAL, "bad work kind %d", (int)w->kind); break;
        }
        ts__flight_end(&pg->fr, w->fid, st == TS_OK);
        if (st != TS_OK) {
            if (atomic_load(&pg->aborted)) { /* a consequence of the abort (e.g. our own closed socket) */
                st = aborted_error(pg, ts_coll_kind_name(w->kind));
            } else {
                /* Ranks are out of step now: abort so that every later call fails fast. A peer
                 * that went away may have given up on a third rank: name it if it is silent. */
                char reason[1024], note[400] = "";
                snprintf(reason, sizeof reason, "%s", ts_last_error());
                ts__hb_blame b;
                ts_pg_op_record r;
                bool have = ts__flight_get(&pg->fr, w->fid, &r);
                bool suspect = have && st == TS_ERR_REMOTE && ts__heartbeat_suspect(pg->hb, &r, &b, note, sizeof note) >= 0;
                if (have && st == TS_ERR_TIMEOUT) behind_note(pg, &r, note, sizeof note);
                snprintf(reason + strlen(reason), sizeof reason - strlen(reason), "%s", note);
                pg_fail(pg, st, reason, st == TS_ERR_TIMEOUT ? TS__CAUSE_TIMEOUT : TS__CAUSE_ERROR, suspect ? &b : NULL,
                        have ? &r : NULL);
                ts_error(st, "%s", reason);
            }
        }
    }
    w->status = st;
    snprintf(w->msg, sizeof w->msg, "%s", st == TS_OK ? "" : ts_last_error());
}

static void work_release(ts_work *w) {
    if (!w || atomic_fetch_sub(&w->refs, 1) != 1) return;
    ts_tensor_release(w->hold[0]);
    ts_tensor_release(w->hold[1]);
    pthread_cond_destroy(&w->cv);
    pthread_mutex_destroy(&w->mu);
    free(w);
}

static void complete(ts_work *w) {
    ts_tensor_release(w->hold[0]);
    ts_tensor_release(w->hold[1]);
    w->hold[0] = w->hold[1] = NULL;
    pthread_mutex_lock(&w->mu);
    atomic_store_explicit(&w->done, true, memory_order_release);
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
    work_release(w);
}

static void *comm_thread(void *arg) {
    ts_process_group *pg = arg;
    pthread_mutex_lock(&pg->mu);
    for (;;) {
        while (!pg->stop && (!pg->head || pg->running)) pthread_cond_wait(&pg->cv, &pg->mu);
        if (!pg->head || pg->running) {
            if (pg->stop && !pg->running) break;
            continue;
        }
        ts_work *w = pg->head;
        pg->head = w->next;
        if (!pg->head) pg->tail = NULL;
        pg->running = true;
        pthread_mutex_unlock(&pg->mu);
        execute(pg, w);
        complete(w);
        pthread_mutex_lock(&pg->mu);
        pg->running = false;
        pthread_cond_broadcast(&pg->cv);
    }
    pthread_mutex_unlock(&pg->mu);
    return NULL;
}

static ts_work *work_new(ts_process_group *pg, ts_coll_kind kind) {
    ts_work *w = ts__calloc(1, sizeof *w);
    if (!w) return NULL;
    atomic_init(&w->refs, 1);
    atomic_init(&w->done, false);
    w->pg = pg;
    w->kind = kind;
    pthread_mutex_init(&w->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&w->cv, &ca);
    pthread_condattr_destroy(&ca);
    return w;
}

/* Waits up to timeout_s (INFINITY: forever) for w->done and only waits; whether it is done. */
static bool wait_until_done(ts_work *w, double timeout_s) {
    /* Spin briefly: most collectives finish within microseconds of the call. */
    for (int i = 0; i < 2000 && !atomic_load_explicit(&w->done, memory_order_acquire); i++) {
    }
    if (!atomic_load_explicit(&w->done, memory_order_acquire)) {
        struct timespec dl;
        clock_gettime(CLOCK_MONOTONIC, &dl);
        bool forever = !isfinite(timeout_s);
        if (!forever) {
            double t = (double)dl.tv_sec + dl.tv_nsec * 1e-9 + timeout_s;
            dl.tv_sec = (time_t)t;
            dl.tv_nsec = (long)((t - (double)dl.tv_sec) * 1e9);
        }
        pthread_mutex_lock(&w->mu);
        while (!atomic_load(&w->done)) {
            if (forever) pthread_cond_wait(&w->cv, &w->mu);
            else if (pthread_cond_timedwait(&w->cv, &w->mu, &dl) != 0 && !atomic_load(&w->done)) break;
        }
        pthread_mutex_unlock(&w->mu);
    }
    return atomic_load_explicit(&w->done, memory_order_acquire);
}

static ts_status wait_done(ts_work *w, double timeout_s) {
    if (!wait_until_done(w, timeout_s)) {
        char reason[600], what[200] = "", late[300] = "";
        ts_pg_op_record r;
        bool have = ts__flight_get(&w->pg->fr, w->fid, &r);
        if (have) {
            ts__flight_describe(&r, what, sizeof what);
            behind_note(w->pg, &r, late, sizeof late);
        }
        snprintf(reason, sizeof reason, "%s (work #%llu%s%s) did not complete within %g s%s", ts_coll_kind_name(w->kind),
                 (unsigned long long)w->id, what[0] ? ": " : "", what, timeout_s, late);
        pg_fail(w->pg, TS_ERR_TIMEOUT, reason, TS__CAUSE_TIMEOUT, NULL, have ? &r : NULL);
        return ts_error(TS_ERR_TIMEOUT, "%s; process group '%s' aborted (rank %d, host %s, pid %d)", reason,
                        w->pg->name, w->pg->rank, w->pg->host, (int)getpid());
    }
    if (w->status != TS_OK) return ts_error(w->status, "%s", w->msg);
    return TS_OK;
}

/* Runs w now (blocking, work_out == NULL) or queues it. Takes ownership of w. */
static ts_status submit(ts_process_group *pg, ts_work *w, ts_work **work_out) {
    if (atomic_load(&pg->aborted)) {
        ts_status st = aborted_error(pg, ts_coll_kind_name(w->kind));
        work_release(w);
        return st;
    }
    pthread_mutex_lock(&pg->mu);
    w->id = ++pg->next_id;
    bool inline_run = !work_out && !pg->head && !pg->running && !pg->stop;
    bool rooted = ts_coll_kind_is_p2p(w->kind) || w->kind == TS_COLL_BROADCAST || w->kind == TS_COLL_REDUCE;
    bool reducing = w->kind == TS_COLL_ALL_REDUCE || w->kind == TS_COLL_REDUCE || w->kind == TS_COLL_REDUCE_SCATTER;
    w->fid = ts__flight_issue(&pg->fr, w->kind, w->dt, reducing ? (int)w->op : -1,
                              w->kind == TS_COLL_BARRIER ? 0 : w->count, rooted ? w->arg : -1, work_out != NULL, inline_run);
    if (inline_run) { /* idle: run inline */
        pg->running = true;
        pthread_mutex_unlock(&pg->mu);
        execute(pg, w);
        pthread_mutex_lock(&pg->mu);
        pg->running = false;
        if (pg->head) pthread_cond_broadcast(&pg->cv);
        pthread_mutex_unlock(&pg->mu);
        ts_status st = w->status;
        if (st != TS_OK) ts_error(st, "%s", w->msg);
        work_release(w);
        return st;
    }
    if (pg->stop) {
        pthread_mutex_unlock(&pg->mu);
        ts__flight_end(&pg->fr, w->fid, false);
        work_release(w);
        return ts_error(TS_ERR_STATE, "%s: process group '%s' is being freed", ts_coll_kind_name(w->kind), pg->name);
    }
    if (!pg->has_thread) {
        if (pthread_create(&pg->thread, NULL, comm_thread, pg) != 0) {
            pthread_mutex_unlock(&pg->mu);
            ts__flight_end(&pg->fr, w->fid, false);
            work_release(w);
            return ts_error(TS_ERR_INTERNAL, "could not start the communication thread of process group '%s'",
                            pg->name);
        }
        pg->has_thread = true;
    }
    atomic_fetch_add(&w->refs, 1); /* the queue's reference */
    w->next = NULL;
    if (pg->tail) pg->tail->next = w;
    else pg->head = w;
    pg->tail = w;
    pthread_cond_broadcast(&pg->cv);
    pthread_mutex_unlock(&pg->mu);
    if (work_out) {
        *work_out = w;
        return TS_OK;
    }
    ts_status st = wait_done(w, INFINITY); /* the backend bounds each operation by the group's timeout */
    work_release(w);
    return st;
}

ts_status ts_work_wait(ts_work *w, double timeout_s) {
    TS_ARG(w, "ts_work_wait: work is NULL");
    if (atomic_load_explicit(&w->done, memory_order_acquire)) /* its group may be gone already */
        return w->status == TS_OK ? TS_OK : ts_error(w->status, "%s", w->msg);
    if (timeout_s < 0) timeout_s = w->pg->timeout_s;
    return wait_done(w, timeout_s);
}

bool ts_work_wait_for(ts_work *w, double seconds) {
    if (!w) return true;
    return wait_until_done(w, seconds > 0 ? seconds : 0.0);
}

bool ts_work_is_completed(ts_work *w) { return !w || atomic_load_explicit(&w->done, memory_order_acquire); }

void ts_work_free(ts_work *w) {
    if (!w) return;
    if (!atomic_load(&w->done)) {
        ts_status st = wait_done(w, w->pg->timeout_s);
        if (st != TS_OK && !atomic_load(&w->done)) wait_done(w, INFINITY); /* aborted: finishes promptly */
    }
    work_release(w);
}

/* ---- argument checks -------------------------------------------------------------------------------- */
static ts_status check_pg(const ts_process_group *pg, const char *op) {
    TS_ARG(pg, "%s: process group is NULL", op);
    return TS_OK;
}

static ts_status check_tensor(const ts_process_group *pg, const char *op, const char *arg, const ts_tensor *t) {
    TS_ARG(t, "%s: %s is NULL (rank %d)", op, arg, pg->rank);
    char sh[96];
    ts_device *dev = ts_tensor_device(t);
    if (ts_device_type_of(dev) != TS_DEVICE_CPU && !pg->be->device_buffers)
        return ts_error(TS_ERR_DEVICE, "%s: %s is on device %s; the %s backend needs CPU tensors (rank %d)", op, arg,
                        ts_device_name(dev), pg->be->name, pg->rank);
    if (ts_device_type_of(dev) != TS_DEVICE_CPU && dev != pg->ctx.device)
        return ts_error(TS_ERR_DEVICE, "%s: %s is on device %s; the %s backend of this group runs on %s (rank %d)", op,
                        arg, ts_device_name(dev), pg->be->name, pg->ctx.device ? ts_device_name(pg->ctx.device) : "no device",
                        pg->rank);
    if (!ts_tensor_is_contiguous(t))
        return ts_error(TS_ERR_INVALID_ARG, "%s: %s %s is not contiguous (rank %d)", op, arg,
                        ts_shape_str(ts_tensor_ndim(t), ts_tensor_shape(t), sh, sizeof sh), pg->rank);
    return TS_OK;
}

static ts_status check_op(const ts_process_group *pg, const char *op, ts_reduce_op rop, ts_dtype dt) {
    TS_ARG(rop >= TS_REDUCE_SUM && rop <= TS_REDUCE_MIN, "%s: unknown reduce op %d (rank %d)", op, (int)rop, pg->rank);
    if (dt == TS_BF16 && !pg->be->reduces_bf16)
        return ts_error(TS_ERR_DTYPE, "%s: the %s backend reduces float32 only, not bfloat16 (rank %d)", op,
                        pg->be->name, pg->rank);
    if (dt != TS_F32 && dt != TS_BF16)
        return ts_error(TS_ERR_DTYPE, "%s: reduce ops need float32 or bfloat16, got %s (rank %d)", op,
                        (unsigned)dt < TS_DTYPE_COUNT ? ts_dtype_name(dt) : "an unknown dtype", pg->rank);
    return TS_OK;
}

static ts_status check_rank(const ts_process_group *pg, const char *op, const char *what, int r) {
    TS_ARG(r >= 0 && r < pg->world, "%s: %s %d is out of range for world size %d (rank %d)", op, what, r, pg->world,
           pg->rank);
    return TS_OK;
}

static ts_status queue(ts_process_group *pg, ts_coll_kind kind, void *buf, const void *in, size_t count, ts_dtype dt,
                       ts_reduce_op op, int arg, int tag, ts_tensor *h0, ts_tensor *h1, ts_work **work) {
    if (work) *work = NULL;
    ts_work *w = work_new(pg, kind);
    if (!w) return TS_ERR_NOMEM;
    w->buf = buf;
    w->in = in;
    w->count = count;
    w->dt = dt;
    w->op = op;
    w->arg = arg;
    w->tag = tag;
    if (work) { /* asynchronous: keep the tensors alive until the work completes */
        w->hold[0] = h0 ? ts_tensor_retain(h0) : NULL;
        w->hold[1] = h1 ? ts_tensor_retain(h1) : NULL;
    }
    return submit(pg, w, work);
}

/* ---- collectives -------------------------------------------------------------------------------------- */
ts_status ts_all_reduce(ts_process_group *pg, ts_tensor *t, ts_reduce_op op, ts_work **work) {
    TS_TRY(check_pg(pg, "all_reduce"));
    TS_TRY(check_tensor(pg, "all_reduce", "tensor", t));
    TS_TRY(check_op(pg, "all_reduce", op, ts_tensor_dtype(t)));
    return queue(pg, TS_COLL_ALL_REDUCE, ts__ptr(t), NULL, (size_t)ts_tensor_numel(t), ts_tensor_dtype(t), op, 0, 0,
                 t, NULL, work);
}

ts_status ts_all_reduce_buffer(ts_process_group *pg, void *buf, size_t count, ts_dtype dt, ts_reduce_op op,
                               ts_work **work) {
    TS_TRY(check_pg(pg, "all_reduce_buffer"));
    TS_ARG(buf || count == 0, "all_reduce_buffer: buf is NULL with count %zu (rank %d)", count, pg->rank);
    TS_TRY(check_op(pg, "all_reduce_buffer", op, dt));
    return queue(pg, TS_COLL_ALL_REDUCE, buf, NULL, count, dt, op, 0, 0, NULL, NULL, work);
}

ts_status ts_broadcast(ts_process_group *pg, ts_tensor *t, int root, ts_work **work) {
    TS_TRY(check_pg(pg, "broadcast"));
    TS_TRY(check_tensor(pg, "broadcast", "tensor", t));
    TS_TRY(check_rank(pg, "broadcast", "root", root));
    return queue(pg, TS_COLL_BROADCAST, ts__ptr(t), NULL, (size_t)ts_tensor_numel(t), ts_tensor_dtype(t),
                 TS_REDUCE_SUM, root, 0, t, NULL, work);
}

ts_status ts_reduce(ts_process_group *pg, ts_tensor *t, int root, ts_reduce_op op, ts_work **work) {
    TS_TRY(check_pg(pg, "reduce"));
    TS_TRY(check_tensor(pg, "reduce", "tensor", t));
    TS_TRY(check_rank(pg, "reduce", "root", root));
    TS_TRY(check_op(pg, "reduce", op, ts_tensor_dtype(t)));
    return queue(pg, TS_COLL_REDUCE, ts__ptr(t), NULL, (size_t)ts_tensor_numel(t), ts_tensor_dtype(t), op, root, 0,
                 t, NULL, work);
}

ts_status ts_all_gather(ts_process_group *pg, ts_tensor *out, const ts_tensor *in, ts_work **work) {
    TS_TRY(check_pg(pg, "all_gather"));
    TS_TRY(check_tensor(pg, "all_gather", "out", out));
    TS_TRY(check_tensor(pg, "all_gather", "in", in));
    char a[96], b[96];
    if (ts_tensor_dtype(out) != ts_tensor_dtype(in))
        return ts_error(TS_ERR_DTYPE, "all_gather: out is %s but in is %s (rank %d)",
                        ts_dtype_name(ts_tensor_dtype(out)), ts_dtype_name(ts_tensor_dtype(in)), pg->rank);
    if (ts_tensor_numel(out) != (int64_t)pg->world * ts_tensor_numel(in))
        return ts_error(TS_ERR_SHAPE,
                        "all_gather: out %s has %lld elements, expected world_size %d x in %s (%lld elements) = "
                        "%lld (rank %d)",
                        ts_shape_str(ts_tensor_ndim(out), ts_tensor_shape(out), a, sizeof a),
                        (long long)ts_tensor_numel(out), pg->world,
                        ts_shape_str(ts_tensor_ndim(in), ts_tensor_shape(in), b, sizeof b),
                        (long long)ts_tensor_numel(in), (long long)pg->world * ts_tensor_numel(in), pg->rank);
    return queue(pg, TS_COLL_ALL_GATHER, ts__ptr(out), ts__ptr((ts_tensor *)in), (size_t)ts_tensor_numel(in),
                 ts_tensor_dtype(in), TS_REDUCE_SUM, 0, 0, out, (ts_tensor *)in, work);
}

ts_status ts_reduce_scatter(ts_process_group *pg, ts_tensor *out, const ts_tensor *in, ts_reduce_op op,
                            ts_work **work) {
    TS_TRY(check_pg(pg, "reduce_scatter"));
    TS_TRY(check_tensor(pg, "reduce_scatter", "out", out));
    TS_TRY(check_tensor(pg, "reduce_scatter", "in", in));
    TS_TRY(check_op(pg, "reduce_scatter", op, ts_tensor_dtype(in)));
    TS_TRY(check_op(pg, "reduce_scatter", op, ts_tensor_dtype(out)));
    if (ts_tensor_dtype(in) != ts_tensor_dtype(out))
        return ts_error(TS_ERR_DTYPE, "reduce_scatter: in is %s, out %s (rank %d)", ts_dtype_name(ts_tensor_dtype(in)),
                        ts_dtype_name(ts_tensor_dtype(out)), pg->rank);
    char a[96], b[96];
    if (ts_tensor_numel(in) != (int64_t)pg->world * ts_tensor_numel(out))
        return ts_error(TS_ERR_SHAPE,
                        "reduce_scatter: in %s has %lld elements, expected world_size %d x out %s (%lld elements) = "
                        "%lld (rank %d)",
                        ts_shape_str(ts_tensor_ndim(in), ts_tensor_shape(in), a, sizeof a),
                        (long long)ts_tensor_numel(in), pg->world,
                        ts_shape_str(ts_tensor_ndim(out), ts_tensor_shape(out), b, sizeof b),
                        (long long)ts_tensor_numel(out), (long long)pg->world * ts_tensor_numel(out), pg->rank);
    return queue(pg, TS_COLL_REDUCE_SCATTER, ts__ptr(out), ts__ptr((ts_tensor *)in),
                 (size_t)ts_tensor_numel(out), ts_tensor_dtype(out), op, 0, 0, out, (ts_tensor *)in, work);
}

ts_status ts_barrier(ts_process_group *pg, ts_work **work) {
    TS_TRY(check_pg(pg, "barrier"));
    return queue(pg, TS_COLL_BARRIER, NULL, NULL, 0, TS_F32, TS_REDUCE_SUM, 0, 0, NULL, NULL, work);
}

ts_status ts_send(ts_process_group *pg, const ts_tensor *t, int dst, int tag) {
    TS_TRY(check_pg(pg, "send"));
    TS_TRY(check_tensor(pg, "send", "tensor", t));
    TS_TRY(check_rank(pg, "send", "destination", dst));
    TS_ARG(dst != pg->rank, "send: rank %d cannot send to itself", pg->rank);
    return queue(pg, TS_COLL_SEND, NULL, ts__ptr((ts_tensor *)t), (size_t)ts_tensor_numel(t), ts_tensor_dtype(t),
                 TS_REDUCE_SUM, dst, tag, NULL, NULL, NULL);
}

ts_status ts_recv(ts_process_group *pg, ts_tensor *t, int src, int tag) {
    TS_TRY(check_pg(pg, "recv"));
    TS_TRY(check_tensor(pg, "recv", "tensor", t));
    TS_TRY(check_rank(pg, "recv", "source", src));
    TS_ARG(src != pg->rank, "recv: rank %d cannot receive from itself", pg->rank);
    return queue(pg, TS_COLL_RECV, ts__ptr(t), NULL, (size_t)ts_tensor_numel(t), ts_tensor_dtype(t), TS_REDUCE_SUM,
                 src, 0 + tag, NULL, NULL, NULL);
}
