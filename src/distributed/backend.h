/*
 * distributed/backend.h — the table of functions behind a process group's backend
 * (internal). The process group (pg.c) validates arguments, queues work and
 * runs every entry below on its communication thread (or inline on the caller
 * when the queue is idle), one at a time: backends need no locking of their
 * own except in abort(), which may be called from any thread while an
 * operation is running.
 *
 * Every operation works on raw buffers — host memory, and for a backend with
 * device_buffers also memory of ctx->device (the NCCL backend stages host
 * buffers through its device) — is synchronous, honours
 * ctx->timeout_s per call (TS_ERR_TIMEOUT naming the op and the peer it waited
 * for), returns TS_ERR_REMOTE naming the rank when a peer dies or aborts, and
 * returns promptly once *ctx->aborted becomes non-zero.
 */
#ifndef TS_DIST_BACKEND_H
#define TS_DIST_BACKEND_H

#include "tessera/dist.h"

#include <stdatomic.h>

/* What a backend is given at init (borrowed; lives as long as the group). */
typedef struct ts__backend_ctx {
    ts_store *store; /* already prefixed with the group name; all ranks have joined */
    int rank, world_size, local_rank, local_world_size;
    double timeout_s;
    const char *group_name;
    const atomic_int *aborted; /* set by ts_pg_abort (any thread) */
    ts_device *device;         /* the group's device (ts_pg_options.device); NULL: none named */
} ts__backend_ctx;

typedef struct ts__backend_ops {
    const char *name;
    /* *state receives the backend's private state (freed by destroy). */
    ts_status (*init)(const ts__backend_ctx *ctx, void **state);
    /* In place over count elements; reduce ops take TS_F32, and TS_BF16 where reduces_bf16 (pg.c checks). */
    ts_status (*all_reduce)(void *st, void *buf, size_t count, ts_dtype dt, ts_reduce_op op);
    ts_status (*broadcast)(void *st, void *buf, size_t count, ts_dtype dt, int root);
    /* Result on root; other ranks' buf is clobbered. */
    ts_status (*reduce)(void *st, void *buf, size_t count, ts_dtype dt, ts_reduce_op op, int root);
    /* out: world * count elements; in: count elements (may alias out + rank * count). */
    ts_status (*all_gather)(void *st, void *out, const void *in, size_t count, ts_dtype dt);
    /* in: world * count elements; out: count elements, the reduction of block rank. */
    ts_status (*reduce_scatter)(void *st, void *out, const void *in, size_t count, ts_dtype dt, ts_reduce_op op);
    ts_status (*barrier)(void *st);
    ts_status (*send)(void *st, const void *buf, size_t count, ts_dtype dt, int dst, int tag);
    ts_status (*recv)(void *st, void *buf, size_t count, ts_dtype dt, int src, int tag);
    /* Any thread, any time: wakes the running operation, tells peers this rank is gone. */
    void (*abort)(void *st, const char *reason);
    /* After the last operation: closes connections, frees state. */
    void (*destroy)(void *st);
    /* Optional: how this rank reaches its peers, one line ("shared memory with ranks 1; TCP with ranks 2,3"). */
    void (*describe)(void *st, char *buf, size_t n);
    /* ---- capabilities: what pg.c asks of a backend (never its name, which is for messages) ---- */
    bool reduces_bf16; /* all_reduce, reduce and reduce_scatter take TS_BF16 (combined in float32 per hop) */
    /* Buffers may be memory of the group's device (ts__pg_device), read and written in the order of the
     * work the caller queued on that device before the call; host buffers are staged through it. */
    bool device_buffers;
    /* The launcher's runtime is the rendezvous (MPI): with no store, no store-based init_method and no
     * MASTER_ADDR, the group joins without a shared store (pg.c's "Rendezvous under mpirun") and the
     * backend checks rank and size itself. */
    bool joins_without_store;
} ts__backend_ops;

/* The backends built into this library. The MPI and NCCL backends add themselves
 * here and in pg.c's table of names under #ifdef TS_HAVE_MPI / TS_HAVE_NCCL. */
extern const ts__backend_ops ts__builtin_backend;
#ifdef TS_HAVE_MPI
extern const ts__backend_ops ts__mpi_backend;
#endif
#ifdef TS_HAVE_NCCL
extern const ts__backend_ops ts__nccl_backend;
#endif

#endif /* TS_DIST_BACKEND_H */
