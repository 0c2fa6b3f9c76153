/*
 * tessera/dist.h — multi-process training: rendezvous stores, process groups
 * and collectives, distributed data parallel, distributed samplers.
 *
 * The model is torch.distributed's: every process (rank) owns one device and
 * its own data; only gradients cross between ranks. A process group is created
 * from a rendezvous (env://, tcp://host:port, file://path, or a given store);
 * collectives on it are called by every rank in the same order.
 *
 * Errors never hang silently: every blocking call honours the group's timeout
 * (default 1800 s, TS_DIST_TIMEOUT seconds in the environment, or the options)
 * and a peer that dies makes the others return TS_ERR_REMOTE / TS_ERR_TIMEOUT
 * with a message naming the rank. A peer that stops (SIGSTOP, a debugger, a
 * hung host) is named within the heartbeat timeout (default 30 s), whatever
 * the collective timeout: see "liveness" below.
 */
#ifndef TESSERA_DIST_H
#define TESSERA_DIST_H

#include "tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TS_DIST_DEFAULT_TIMEOUT_S 1800.0
/* The largest world size a rendezvous accepts (2^20 ranks); a larger one is an error saying so. */
#define TS_DIST_MAX_WORLD_SIZE 1048576

/* ---- rendezvous stores (gloo/torch semantics) ------------------------------------------ */
/* A key-value store shared by all ranks: set, get (waits for the key), add (an
 * atomic counter), wait for keys, check. Refcounted; thread-safe. */
typedef struct ts_store ts_store;

/* TCP store: the server (rank 0) listens on host:port and also acts as a client;
 * others connect, retrying until timeout_s. A port in use, or a master that
 * cannot be reached within the timeout, is an error naming host and port.
 * port 0 with is_server picks a free port (see ts_store_tcp_port). */
ts_status ts_store_tcp_new(const char *host, int port, bool is_server, double timeout_s, ts_store **out);
int ts_store_tcp_port(const ts_store *s); /* the port actually listened on / connected to */

/* The job token and the server's limits. Every connection to a TCP store (and
 * every TCP link of the built-in backend) starts with a mutual challenge-response
 * over HMAC-SHA256 keyed with the job token: a process without the token can
 * neither read nor write keys, and a client never talks to a server that cannot
 * prove it has the token. ts_store_tcp_new takes the token from TS_JOB_TOKEN
 * (`tessera run` sets one); without one the store runs unauthenticated and the
 * process logs a warning once. A client refused by the server, or a server that
 * fails its proof, is a TS_ERR_REMOTE naming host:port and the reason. */
/* A fresh job token, what `tessera run` (ts_launch_run) gives its ranks as TS_JOB_TOKEN: 32 bytes from
 * the kernel's CSPRNG as TS_JOB_TOKEN_CHARS lowercase hex digits and a NUL, written into out, which the
 * caller owns (TS_JOB_TOKEN_CHARS + 1 bytes). It is a secret: keep it out of logs and command lines, and
 * overwrite the buffer when done. TS_ERR_IO when the kernel gives no random bytes. */
#define TS_JOB_TOKEN_CHARS 64
ts_status ts_job_token_new(char out[TS_JOB_TOKEN_CHARS + 1]);

typedef struct ts_store_tcp_options {
    size_t size;          /* sizeof(ts_store_tcp_options) */
    unsigned int magic;   /* TS_STORE_TCP_OPTIONS_MAGIC */
    unsigned int version; /* TS_STORE_TCP_OPTIONS_VERSION */
    const char *token;    /* the job token (copied); NULL: TS_JOB_TOKEN from the environment; "": none */
    /* Server only (0: the default). A client exceeding a limit is dropped and logged. */
    int max_connections;    /* open connections; default 16384, or 3/4 of RLIMIT_NOFILE when lower; >= 2 */
    size_t max_key_bytes;   /* default 64 KiB */
    size_t max_value_bytes; /* default 64 MiB; key + value limits at most 1 GiB together */
    double auth_timeout_s;  /* a connection that has not authenticated by then is closed; default 3 */
    /* Version 2. Stored bytes (keys + values): a SET or ADD that would pass a limit is refused with an
     * error naming it (the client stays connected; the server keeps running). */
    size_t max_total_bytes; /* everything the store holds; default 512 MiB + 1 MiB per rank of world_size */
    size_t max_conn_bytes;  /* what one connection may add; default 2 x max_value_bytes (at most the total) */
    /* Both sides: the job's world size (0: unknown). A client with a rank identifies itself as it
     * authenticates; when the server is full, connections that are not a rank's (or beyond 8 per
     * rank) are closed first, so a flood of authenticated idle connections cannot lock ranks out. */
    int world_size;
    int rank; /* client: this process's rank, -1: none */
} ts_store_tcp_options;

#define TS_STORE_TCP_OPTIONS_MAGIC 0x7e5a9002u
#define TS_STORE_TCP_OPTIONS_VERSION 2u /* version 1 (without the fields from max_total_bytes on) is still accepted */
#define TS_STORE_TCP_OPTIONS_INIT                                                                        \
    ((ts_store_tcp_options){sizeof(ts_store_tcp_options), TS_STORE_TCP_OPTIONS_MAGIC,                    \
                            TS_STORE_TCP_OPTIONS_VERSION, NULL, 0, 0, 0, 0.0, 0, 0, 0, -1})

/* ts_store_tcp_new with options (NULL: the defaults, as ts_store_tcp_new). */
ts_status ts_store_tcp_new_ex(const char *host, int port, bool is_server, double timeout_s,
                              const ts_store_tcp_options *opts, ts_store **out);
/* File store: a file on a filesystem shared by all ranks (locked with fcntl). */
ts_status ts_store_file_new(const char *path, double timeout_s, ts_store **out);
/* In-memory store, shared by threads of one process (ranks-as-threads tests). */
ts_status ts_store_memory_new(ts_store **out);
/* A client of a PyTorch TCPStore (torch.distributed.TCPStore, torchrun's agent
 * store) at host:port, speaking its wire protocol: every rank is a client, none
 * serves. Keys are stored as torch's own client names them ("/" + key), so
 * Python's store.get("k") reads what ts_store_set(s, "k", ...) wrote. Connecting
 * is retried until timeout_s; a server that does not answer like a TCPStore is
 * an error naming host and port. Keys up to 8 KiB, values up to 8 MiB (the
 * limits of torch's server). */
ts_status ts_store_torch_new(const char *host, int port, double timeout_s, ts_store **out);
/* Every key is prefixed with "prefix/" before it reaches base (retained). */
ts_status ts_store_prefix_new(ts_store *base, const char *prefix, ts_store **out);

ts_store *ts_store_retain(ts_store *s);
void ts_store_release(ts_store *s); /* NULL is fine */

ts_status ts_store_set(ts_store *s, const char *key, const void *value, size_t len);
/* Waits up to the store's timeout for key; *value is malloc'd (caller frees), NUL-terminated past len. */
ts_status ts_store_get(ts_store *s, const char *key, void **value, size_t *len);
/* Atomically adds delta to the integer stored at key (absent: 0); *result gets the new value. */
ts_status ts_store_add(ts_store *s, const char *key, int64_t delta, int64_t *result);
/* Waits until every key exists; TS_ERR_TIMEOUT naming the first missing key. timeout_s < 0: the store's. */
ts_status ts_store_wait(ts_store *s, const char *const *keys, int nkeys, double timeout_s);
ts_status ts_store_check(ts_store *s, const char *key, bool *exists);
void ts_store_set_timeout(ts_store *s, double timeout_s);

/* ---- launch environment ------------------------------------------------------------------------ */
/* Where this process sits, read from the variables its launcher set. Launchers,
 * innermost first (the first one whose variables are set describes this process):
 *   "torchrun" / "tessera-run" / "env"  RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE
 *                (torchrun: TORCHELASTIC_RUN_ID is set; tessera run: TS_LAUNCHED_BY; "env": by hand)
 *   "mpirun"     Open MPI: OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE
 *   "hydra"      MPICH / Intel MPI mpiexec, srun --mpi=pmi2: PMI_RANK, PMI_SIZE, MPI_LOCALRANKID, MPI_LOCALNRANKS
 *   "srun"       a task of a Slurm job step (SLURM_STEP_ID set): SLURM_PROCID, SLURM_STEP_NUM_TASKS
 *                (else SLURM_NTASKS), SLURM_LOCALID, SLURM_STEP_TASKS_PER_NODE/SLURM_TASKS_PER_NODE at
 *                SLURM_NODEID. An sbatch script or salloc shell is not a step: one process.
 * PMIX_RANK (PMIx launchers) must agree with the launcher that gives the size (alone, 0 is a singleton).
 * MASTER_ADDR/MASTER_PORT win when set; otherwise srun gives the first host of
 * SLURM_STEP_NODELIST / SLURM_JOB_NODELIST ("node[01-03,07]" -> node01) and port
 * 10000 + SLURM_JOB_ID % 20000; mpirun and hydra give 127.0.0.1 when every rank
 * is on this host and 10000 + job id % 20000. Partial variables (RANK without
 * WORLD_SIZE), RANK >= WORLD_SIZE, or RANK set by hand disagreeing with the
 * launcher around it (SLURM_PROCID, OMPI_COMM_WORLD_RANK) are TS_ERR_INVALID_ARG
 * naming the variables and their values. */
typedef struct ts_dist_env {
    int rank, world_size, local_rank, local_world_size; /* local ones -1 when the launcher does not say */
    char master_addr[256];
    int master_port; /* 0 when unset */
    const char *source; /* "none", "torchrun", "tessera-run", "env", "mpirun", "hydra", "srun" (static) */
    /* The variable master_addr / master_port came from ("MASTER_ADDR", "SLURM_JOB_NODELIST", ...; "" if none). */
    const char *master_addr_from, *master_port_from;
    bool torch_agent_store; /* TORCHELASTIC_USE_AGENT_STORE=True: torchrun's agent serves a TCPStore on MASTER_PORT */
    int restart_count;      /* TORCHELASTIC_RESTART_COUNT, else 0 */
} ts_dist_env;
/* Needs a launcher and MASTER_ADDR: TS_ERR_INVALID_ARG naming the missing or malformed variable. */
ts_status ts_dist_env_read(ts_dist_env *out);
/* "Am I one rank of a larger job?" Reads the same variables and requires
 * nothing: with no launcher, source "none" and rank 0 of 1. *in_job (NULL is
 * fine) is true when world_size > 1: join the job (ts_pg_new with env://) rather
 * than run alone. Errors as ts_dist_env_read's for partial or contradictory
 * variables. */
ts_status ts_dist_env_detect(ts_dist_env *out, bool *in_job);

/* ---- process groups ------------------------------------------------------------------------------ */
typedef struct ts_process_group ts_process_group;

typedef enum ts_reduce_op { TS_REDUCE_SUM = 0, TS_REDUCE_AVG, TS_REDUCE_MAX, TS_REDUCE_MIN } ts_reduce_op;

typedef struct ts_pg_options {
    size_t size;          /* sizeof(ts_pg_options) */
    unsigned int magic;   /* TS_PG_OPTIONS_MAGIC */
    unsigned int version; /* TS_PG_OPTIONS_VERSION */
    const char *backend;  /* "builtin" (shared memory + TCP), "mpi", "nccl" (CUDA builds); NULL: builtin */
    /* Rendezvous: a store (retained), else init_method "env://" (default; under
     * torchrun with TORCHELASTIC_USE_AGENT_STORE=True every rank is a client of the
     * agent's TCPStore), "tcp://host:port", "torch-tcp://host:port" (a PyTorch
     * TCPStore someone else serves) or "file:///path". */
    ts_store *store;
    const char *init_method;
    int rank, world_size;             /* -1: from the environment */
    int local_rank, local_world_size; /* -1: from the environment, else derived from host names */
    double timeout_s;                 /* <= 0: TS_DIST_TIMEOUT or TS_DIST_DEFAULT_TIMEOUT_S */
    const char *group_name;           /* key prefix in the store; NULL: "default" */
    /* Seconds without a heartbeat from a peer after which a collective waiting
     * on it fails (see "liveness" below). 0: TS_HEARTBEAT_TIMEOUT, else
     * TS_HEARTBEAT_DEFAULT_TIMEOUT_S; < 0: no heartbeats. */
    double heartbeat_timeout_s;
    /* Version 2. The group's device ("cuda:1"): where the nccl backend runs its collectives and the
     * device whose tensors the collectives take besides CPU tensors. NULL: cuda:LOCAL_RANK for nccl
     * (torchrun's one GPU per rank); the builtin and mpi backends take CPU tensors only. */
    const char *device;
} ts_pg_options;

#define TS_PG_OPTIONS_MAGIC 0x7e5a9001u
#define TS_PG_OPTIONS_VERSION 2u
#define TS_PG_OPTIONS_INIT \
    ((ts_pg_options){sizeof(ts_pg_options), TS_PG_OPTIONS_MAGIC, TS_PG_OPTIONS_VERSION, NULL, NULL, NULL, -1, -1, -1, -1, 0.0, NULL, \
                     0.0, NULL})

/* Whether this Tessera has the backend built in ("builtin" always; "mpi", "nccl" when found at build time). */
bool ts_pg_backend_available(const char *name);
/* What a backend built into this Tessera can do: ask this, never compare its name. */
typedef struct ts_pg_backend_caps {
    bool reduces_bf16;        /* all_reduce, reduce and reduce_scatter take bfloat16 (builtin, nccl) */
    bool device_buffers;      /* collectives on the group's GPU memory (nccl) */
    bool joins_without_store; /* plain mpirun is its own rendezvous (mpi) */
} ts_pg_backend_caps;
/* The capabilities of backend name (NULL: "builtin") into *out. TS_ERR_UNSUPPORTED for a backend this
 * Tessera was built without ("mpi", "nccl", torch's "gloo"), TS_ERR_INVALID_ARG for an unknown name;
 * both messages list the backends there are. */
ts_status ts_pg_backend_caps_get(const char *name, ts_pg_backend_caps *out);
/* Joins the group (blocks until every rank has arrived or the timeout). */
ts_status ts_pg_new(const ts_pg_options *opts, ts_process_group **out);
/* Leaves the group: pending work is finished or failed, connections closed. NULL is fine. */
void ts_pg_free(ts_process_group *pg);
int ts_pg_rank(const ts_process_group *pg);
int ts_pg_size(const ts_process_group *pg);
int ts_pg_local_rank(const ts_process_group *pg);
const char *ts_pg_backend_name(const ts_process_group *pg);
/* How this rank reaches its peers, one line: the builtin backend's "shared memory with ranks 1; TCP with
 * ranks 2,3" (ranks on this host share memory; TS_DIST_TRANSPORT=tcp forces TCP), else "<name> backend". */
void ts_pg_describe_links(const ts_process_group *pg, char *buf, size_t n);
/* Whether the group's backend reduces dt (float32 always; bfloat16 on the builtin backend). */
bool ts_pg_reduces_dtype(const ts_process_group *pg, ts_dtype dt);
double ts_pg_timeout(const ts_process_group *pg);
/* Aborts: every pending and later call fails fast; peers see this rank as gone. */
void ts_pg_abort(ts_process_group *pg, const char *reason);

/* ---- liveness: heartbeats and the flight recorder ------------------------------------------------------------ */
/* Heartbeats. Every group of more than one rank that has a shared store runs a
 * heartbeat thread of its own (not the thread that calls collectives, not the
 * communication thread): it sends every peer a small UDP datagram every
 * TS_HEARTBEAT_INTERVAL seconds (default: timeout / 10, at most 1 s) carrying
 * this rank's position (the last collective started and completed) and notes
 * when it last heard from each peer. A rank that waits in a collective (or a
 * send/recv: in its peer) while a peer has not been heard from for the
 * heartbeat timeout aborts the group: the pending and every later call fail
 * with TS_ERR_TIMEOUT and "rank R (host H, pid P) has not been heard from for
 * N s (stopped or hung?) while this rank (Q) was waiting in collective #S op
 * (...)". A rank that computes for a long time between collectives keeps
 * beating and is never failed by this; a process that is stopped or frozen
 * cannot beat. Addresses are exchanged through the rendezvous store, or under
 * plain mpirun (backend "mpi", no store) through one MPI all_gather. A peer
 * is judged only once one of its datagrams arrived (where UDP is blocked
 * between two hosts, one warning, and their stalls end at the collective
 * timeout, whose message then names the ranks that had not started it). */
#define TS_HEARTBEAT_DEFAULT_TIMEOUT_S 30.0
/* The group's heartbeat timeout in seconds; 0 when it has no heartbeats. */
double ts_pg_heartbeat_timeout(const ts_process_group *pg);

/* Flight recorder: every group keeps its last TS_PG_FLIGHT_RECORDER_SIZE
 * operations. On its first failure (a backend error, a timeout, a silent peer,
 * an abort) each rank logs the last 8 at TS_LOG_ERROR, writes all of them to
 * $TS_FLIGHT_RECORDER_DIR/flight-<group>-rank<R>-pid<P>.txt when that is set,
 * and writes a failure report to $TS_RUN_DIR/failure-<group>-rank<R>.txt (set
 * by `tessera run`), which the launcher reads to name the rank the others
 * waited for. */
#define TS_PG_FLIGHT_RECORDER_SIZE 32
typedef enum ts_pg_op_state {
    TS_PG_OP_ISSUED = 0, /* called; queued behind earlier work */
    TS_PG_OP_STARTED,    /* the backend is running it */
    TS_PG_OP_COMPLETED,
    TS_PG_OP_FAILED,
} ts_pg_op_state;
/* What a process group runs: its setup, the collectives, and point-to-point send / recv. */
typedef enum ts_coll_kind {
    TS_COLL_INIT = 0, /* the group's setup: the backend connecting to every rank */
    TS_COLL_ALL_REDUCE,
    TS_COLL_BROADCAST,
    TS_COLL_REDUCE,
    TS_COLL_ALL_GATHER,
    TS_COLL_REDUCE_SCATTER,
    TS_COLL_BARRIER,
    TS_COLL_SEND,
    TS_COLL_RECV,
    TS_COLL_KIND_COUNT
} ts_coll_kind;
/* "init", "all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter", "barrier", "send", "recv"
 * (static; "?" for a value out of range): the names messages and the flight recorder's text use. */
const char *ts_coll_kind_name(ts_coll_kind k);
/* send and recv (numbered apart from the collectives). */
bool ts_coll_kind_is_p2p(ts_coll_kind k);

typedef struct ts_pg_op_record {
    uint64_t seq;        /* collectives: 1, 2, ... in call order (equal on every rank that calls the same
                            collectives); send and recv: their own count, 1, 2, ... */
    ts_coll_kind kind;   /* TS_COLL_INIT: the group's setup (seq 0, the first record) */
    ts_dtype dtype;
    int reduce_op;       /* the ts_reduce_op of all_reduce / reduce / reduce_scatter, else -1 */
    size_t count;        /* elements of this rank's buffer (all_gather: its input; reduce_scatter: its output) */
    size_t bytes;        /* count x element size */
    int peer;            /* the root of broadcast / reduce, the peer of send / recv, else -1 */
    bool async;          /* called with a ts_work handle */
    ts_pg_op_state state;
    double issued_s, started_s, ended_s; /* ts_time_now() when it got there; 0 if it did not */
} ts_pg_op_record;
/* Copies the group's last operations, oldest first, into out[0 .. cap) (at most
 * TS_PG_FLIGHT_RECORDER_SIZE); *n receives how many. Any thread, any time. */
ts_status ts_pg_flight_recorder(const ts_process_group *pg, ts_pg_op_record *out, int cap, int *n);
/* "issued", "started", "completed", "failed" (static). */
const char *ts_pg_op_state_name(ts_pg_op_state s);

/* Asynchronous work: collectives run in issue order on the group's
 * communication thread. */
typedef struct ts_work ts_work;
/* Waits for completion; timeout_s < 0: the group's timeout. Returns the work's status. */
ts_status ts_work_wait(ts_work *w, double timeout_s);
bool ts_work_is_completed(ts_work *w);
/* Waits up to `seconds` for w to complete, and only waits: unlike ts_work_wait, an expired wait fails and
 * aborts nothing. true once w has completed (ts_work_wait(w, 0) then returns its status); NULL: true. For
 * callers that act between waits (the Python package checks for Ctrl-C every 0.1 s). */
bool ts_work_wait_for(ts_work *w, double seconds);
void ts_work_free(ts_work *w); /* waits first if still running */

/* Collectives on contiguous CPU tensors, and with the nccl backend also tensors on the group's CUDA device
 * (ordered after the work queued on that device before the call; CPU tensors are staged through it).
 * Reduce ops take float32, and bfloat16 on the builtin and nccl backends — each hop combines in float32
 * and rounds back; the MPI backend refuses bfloat16 with TS_ERR_DTYPE; any dtype for broadcast,
 * all_gather, send/recv (nccl: send/recv match in call order, tags are not compared). In place unless an out
 * tensor is given. `work`: NULL blocks; otherwise *work is a new handle and t must stay alive until it
 * completes. */
ts_status ts_all_reduce(ts_process_group *pg, ts_tensor *t, ts_reduce_op op, ts_work **work);
ts_status ts_broadcast(ts_process_group *pg, ts_tensor *t, int root, ts_work **work);
/* Result on root only (others' t unspecified afterwards). */
ts_status ts_reduce(ts_process_group *pg, ts_tensor *t, int root, ts_reduce_op op, ts_work **work);
/* out: world_size * numel(in) elements, rank r's input at offset r * numel(in). */
ts_status ts_all_gather(ts_process_group *pg, ts_tensor *out, const ts_tensor *in, ts_work **work);
/* in: world_size * numel(out) elements; rank r gets the reduction of block r. */
ts_status ts_reduce_scatter(ts_process_group *pg, ts_tensor *out, const ts_tensor *in, ts_reduce_op op,
                            ts_work **work);
ts_status ts_barrier(ts_process_group *pg, ts_work **work);
ts_status ts_send(ts_process_group *pg, const ts_tensor *t, int dst, int tag);
ts_status ts_recv(ts_process_group *pg, ts_tensor *t, int src, int tag);
/* Raw buffers (what DDP's buckets use): count elements of dtype, in host memory or (nccl) in the memory of
 * the group's device. */
ts_status ts_all_reduce_buffer(ts_process_group *pg, void *buf, size_t count, ts_dtype dt, ts_reduce_op op,
                               ts_work **work);

/* ---- distributed samplers ------------------------------------------------------------------------- */
/* Exactly torch.utils.data.DistributedSampler: total = ceil(N / R) * R (or
 * floor(N / R) * R with drop_last), indices 0..N-1 shuffled by a generator
 * seeded with seed + epoch (torch.randperm with manual_seed), padded by
 * repeating from the start (drop_last: truncated), rank r takes r, r+R, r+2R... */
typedef struct ts_dist_sampler {
    int64_t n, num_replicas, rank;
    bool shuffle, drop_last, auto_epoch; /* auto_epoch: each ts_dist_sampler_indices advances the epoch */
    uint64_t seed;
    int64_t epoch;
} ts_dist_sampler;

ts_status ts_dist_sampler_init(ts_dist_sampler *s, int64_t n, int64_t num_replicas, int64_t rank, bool shuffle,
                               uint64_t seed, bool drop_last);
void ts_dist_sampler_set_epoch(ts_dist_sampler *s, int64_t epoch);
/* Samples per rank per epoch. */
int64_t ts_dist_sampler_len(const ts_dist_sampler *s);
/* Writes this rank's indices for the current epoch into idx (ts_dist_sampler_len entries). */
ts_status ts_dist_sampler_indices(ts_dist_sampler *s, int64_t *idx);

/* Balanced: every rank gets ceil(n / R) indices whose total cost (cost[i] >= 0
 * per sample) is as equal as possible: samples sorted by cost (ties in the
 * seed+epoch shuffle order), padded to a multiple of R with the globally
 * cheapest samples, and dealt block by block, the j-th most expensive of each
 * block of R to the j-th least-loaded rank. Guarantee: max rank cost - min rank
 * cost <= max cost - min cost. Deterministic in (seed, epoch). idx needs room
 * for ceil(n / R) entries; idx NULL only sets *len. */
ts_status ts_balanced_sampler_indices(const double *cost, int64_t n, int64_t num_replicas, int64_t rank,
                                      uint64_t seed, int64_t epoch, bool shuffle, int64_t *idx, int64_t *len);

#ifdef __cplusplus
}
#endif
#endif /* TESSERA_DIST_H */
