/*
 * distributed/nccl/nccl.c — the "nccl" process-group backend: every collective of backend.h through
 * NCCL on the group's CUDA device, built with the CUDA backend when CMake finds NCCL (TS_HAVE_NCCL).
 *
 * ---- Setup ----------------------------------------------------------------------------------------
 * The group's device is ts_pg_options.device (pg.c resolves it into ctx->device), else cuda:LOCAL_RANK,
 * as torchrun's one-GPU-per-rank convention. Rank 0 makes the unique id (ncclGetUniqueId) and passes it
 * through the rendezvous store (id.c); every rank then creates its communicator non-blocking
 * (ncclCommInitRankConfig with blocking = 0) and polls it, so setup honours the group's timeout and abort
 * flag like every operation. NCCL's own message (ncclGetLastError: "Duplicate GPU detected : rank 0 and
 * rank 1 both on CUDA device ...") goes into the error.
 *
 * ---- Streams and order ----------------------------------------------------------------------------
 * Collectives run on a communication stream of the backend's own (non-blocking, like PyTorch's NCCL
 * streams). Each operation first records an event on the device's compute stream (device/cuda.h: where
 * every kernel and copy for the device is queued) and makes the communication stream wait for it, so the
 * collective reads its buffer after everything the caller queued before (DDP's copies of gradients into a
 * bucket), while kernels queued after the call (the rest of backward) run beside it. Host buffers (CPU
 * tensors: barriers, DDP's broadcasts of the model) are staged through device memory of the device's
 * allocator, copied in and out on the communication stream.
 *
 * ---- Waiting, timeouts, abort ---------------------------------------------------------------------
 * pg.c runs one operation at a time on its communication thread and expects it synchronous: after
 * enqueueing, this backend polls an event recorded behind the collective (cudaEventQuery) and
 * ncclCommGetAsyncError (a peer's network error, a failed proxy), sleeping 20 us, then 200 us after 10 ms.
 * Between polls it checks the abort flag (ts_pg_abort, the heartbeats seeing a dead or hung peer) and the
 * deadline (ctx->timeout_s per call): on either it aborts the communicator (ncclCommAbort), which ends
 * the kernels still waiting for peers, and fails naming the operation and its size. An aborted
 * communicator is not used again: every later operation fails with the first error.
 *
 * ---- Sizes ----------------------------------------------------------------------------------------
 * NCCL counts are size_t; reductions take float32 and bfloat16 (ncclBfloat16: NCCL sums in float32 per
 * hop and rounds), AVG is ncclAvg. broadcast, all_gather and send/recv move bytes (ncclUint8). NCCL has
 * no tags: send/recv between two ranks match in call order, whatever the tag.
 */
#include "distributed/backend.h"
#include "distributed/nccl/nccl.h"
#include "distributed/store.h"
#include "device/cuda.h"

#include "core/internal.h"

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wstrict-prototypes" /* nccl.h's (void)-less declarations */
#include <nccl.h>
#pragma GCC diagnostic pop
#include <stdio.h>
#include <string.h>

_Static_assert(TS_NCCL_ID_BYTES == NCCL_UNIQUE_ID_BYTES, "ncclUniqueId size");

typedef struct nccl_state {
    const ts__backend_ctx *ctx;
    ts_device *dev;
    ncclComm_t comm;
    cudaStream_t cs;           /* the communication stream */
    cudaEvent_t ready, done;   /* compute stream -> cs; behind the collective */
    bool broken;               /* the communicator was aborted: nothing more runs */
    ts_status broken_st;
    char broken_msg[512];
    char desc[160];
} nccl_state;

/* "<ncclGetErrorString>" plus NCCL's last warning when it has one. */
static ts_status nccl_error(const nccl_state *s, ts_status st, ncclResult_t r, const char *what) {
    const char *last = ncclGetLastError(s ? s->comm : NULL);
    return ts_error(st, "nccl (rank %d, %s): %s failed: %s%s%s", s ? s->ctx->rank : -1,
                    s && s->dev ? s->dev->name : "?", what, ncclGetErrorString(r), last && *last ? ": " : "",
                    last && *last ? last : "");
}

/* Marks the communicator unusable after an abort or a fatal error (keeps the first reason). */
static void mark_broken(nccl_state *s, ts_status st) {
    if (s->broken) return;
    s->broken = true;
    s->broken_st = st;
    snprintf(s->broken_msg, sizeof s->broken_msg, "%s", ts_last_error());
    if (s->comm) {
        (void)ncclCommAbort(s->comm);
        s->comm = NULL;
    }
}

static ts_status check_broken(const nccl_state *s, const char *what) {
    if (!s->broken) return TS_OK;
    return ts_error(s->broken_st, "nccl (rank %d): %s: the communicator was aborted earlier: %s", s->ctx->rank, what,
                    s->broken_msg);
}

/* Polls until the event `ev` completed (ev NULL: the communicator left ncclInProgress), NCCL reports an
 * error, the group is aborted or timeout_s passes. */
static ts_status wait_for(nccl_state *s, cudaEvent_t ev, const char *what, size_t bytes, double timeout_s) {
    const double t0 = ts_time_now(), deadline = t0 + timeout_s;
    for (;;) {
        ncclResult_t ar = ncclSuccess;
        ncclResult_t r = ncclCommGetAsyncError(s->comm, &ar);
        if (r != ncclSuccess) ar = r;
        if (ar != ncclSuccess && ar != ncclInProgress) {
            ts_status st = nccl_error(s, TS_ERR_REMOTE, ar, what);
            mark_broken(s, st);
            return st;
        }
        if (ev) {
            cudaError_t e = cudaEventQuery(ev);
            if (e == cudaSuccess) return TS_OK;
            if (e != cudaErrorNotReady) {
                ts_status st = ts__cuda_status(s->dev, e, "cudaEventQuery (nccl)");
                mark_broken(s, st);
                return ts__error_prefix(st, "nccl: %s", what);
            }
        } else if (ar == ncclSuccess) {
            return TS_OK;
        }
        if (atomic_load(s->ctx->aborted)) {
            ts_status st = ts_error(TS_ERR_REMOTE, "nccl (rank %d): %s: the process group was aborted", s->ctx->rank,
                                    what);
            mark_broken(s, st);
            return st;
        }
        const double t = ts_time_now();
        if (t > deadline) {
            ts_status st = ts_error(TS_ERR_TIMEOUT,
                                    "nccl (rank %d, %s): %s of %zu bytes did not complete within %.3g s (a peer "
                                    "that never joined it, or a hung GPU); the communicator was aborted",
                                    s->ctx->rank, s->dev->name, what, bytes, timeout_s);
            mark_broken(s, st);
            return st;
        }
        ts__sleep_s(t - t0 < 0.01 ? 20e-6 : 200e-6);
    }
}

static ts_status make_id(void *user, unsigned char id[TS_NCCL_ID_BYTES]) {
    (void)user;
    ncclUniqueId u;
    ncclResult_t r = ncclGetUniqueId(&u);
    if (r != ncclSuccess) return nccl_error(NULL, TS_ERR_DEVICE, r, "ncclGetUniqueId");
    memcpy(id, u.internal, TS_NCCL_ID_BYTES);
    return TS_OK;
}

static void nccl_destroy(void *st);

static ts_status init_comm(nccl_state *s) {
    const ts__backend_ctx *ctx = s->ctx;
    ts_status st = TS_OK;
    s->dev = ctx->device; /* pg.c's: the options' device, else cuda:LOCAL_RANK */
    if (!s->dev || ts_device_type_of(s->dev) != TS_DEVICE_CUDA)
        return ts_error(TS_ERR_DEVICE, "nccl (rank %d): the group's device is %s; the nccl backend needs a CUDA "
                                       "device (use the builtin backend for CPU tensors)", ctx->rank, s->dev ? s->dev->name : "none");
    TS_TRY(ts__cuda_enter(s->dev, NULL));
    TS_CUDA_TRY(s->dev, cudaStreamCreateWithFlags(&s->cs, cudaStreamNonBlocking));
    TS_CUDA_TRY(s->dev, cudaEventCreateWithFlags(&s->ready, cudaEventDisableTiming));
    TS_CUDA_TRY(s->dev, cudaEventCreateWithFlags(&s->done, cudaEventDisableTiming));

    unsigned char id[TS_NCCL_ID_BYTES];
    TS_TRY(ts__nccl_exchange_id(ctx->store, ctx->rank, ctx->timeout_s, make_id, NULL, id));
    ncclUniqueId uid;
    memcpy(uid.internal, id, TS_NCCL_ID_BYTES);
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    ncclResult_t r = ncclCommInitRankConfig(&s->comm, ctx->world_size, uid, ctx->rank, &cfg);
    if (r != ncclSuccess && r != ncclInProgress) {
        st = nccl_error(s, TS_ERR_DEVICE, r, "ncclCommInitRankConfig");
        s->comm = NULL;
    } else {
        st = wait_for(s, NULL, "creating the communicator", 0, ctx->timeout_s);
    }
    if (st != TS_OK) {
        if (strstr(ts_last_error(), "Duplicate GPU"))
            return ts_error(st, "%s (the nccl backend needs one GPU per rank: `--device cuda` puts rank r on "
                                "cuda:LOCAL_RANK; ranks that share a GPU need --backend builtin)", ts_last_error());
        return st;
    }
    int v = 0;
    ncclGetVersion(&v);
    snprintf(s->desc, sizeof s->desc, "NCCL %d.%d.%d on %s", v / 10000, v / 100 % 100, v % 100, s->dev->name);
    return TS_OK;
}

static ts_status nccl_init(const ts__backend_ctx *ctx, void **state) {
    *state = NULL;
    nccl_state *s = ts__calloc(1, sizeof *s);
    if (!s) return TS_ERR_NOMEM;
    s->ctx = ctx;
    ts_status st = init_comm(s);
    if (st != TS_OK) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", ts_last_error());
        nccl_destroy(s);
        return ts_error(st, "%s", msg);
    }
    *state = s;
    return TS_OK;
}

static void nccl_destroy(void *st) {
    nccl_state *s = st;
    if (!s) return;
    if (s->dev) (void)ts__cuda_enter(s->dev, NULL);
    if (s->comm) {
        /* a clean finish (pending work flushed) within 10 s, else an abort (wait_for aborts on failure) */
        ncclResult_t r = ncclCommFinalize(s->comm);
        if ((r == ncclSuccess || r == ncclInProgress) &&
            wait_for(s, NULL, "finalizing the communicator", 0, 10.0) == TS_OK && s->comm)
            (void)ncclCommDestroy(s->comm);
        else if (s->comm)
            (void)ncclCommAbort(s->comm);
        s->comm = NULL;
    }
    if (s->done) cudaEventDestroy(s->done);
    if (s->ready) cudaEventDestroy(s->ready);
    if (s->cs) cudaStreamDestroy(s->cs);
    free(s);
}

static void nccl_abort(void *st, const char *reason) {
    (void)st;
    (void)reason; /* the polling loop sees ctx->aborted within 200 us and aborts the communicator */
}

static void nccl_describe(void *st, char *buf, size_t n) {
    const nccl_state *s = st;
    snprintf(buf, n, "%s", s->desc);
}

static ncclDataType_t nccl_type(ts_dtype dt) { return dt == TS_BF16 ? ncclBfloat16 : ncclFloat32; }

static ncclRedOp_t nccl_op(ts_reduce_op op) {
    switch (op) {
    case TS_REDUCE_AVG: return ncclAvg;
    case TS_REDUCE_MAX: return ncclMax;
    case TS_REDUCE_MIN: return ncclMin;
    default: return ncclSum;
    }
}

/* One operation: what it is and its buffers (host or device). */

typedef struct nccl_op_args {
    ts_coll_kind kind;
    void *out;          /* written (NULL for send) */
    const void *in;     /* read (== out for in-place ops) */
    size_t in_bytes, out_bytes;
    size_t count;       /* NCCL's count: elements (reductions) or bytes */
    ncclDataType_t type;
    ncclRedOp_t op;
    int peer;           /* root, or send/recv peer */
} nccl_op_args;

static size_t align256(size_t n) { return (n + 255) & ~(size_t)255; }

static bool on_device(const void *p) {
    struct cudaPointerAttributes a;
    if (!p || cudaPointerGetAttributes(&a, p) != cudaSuccess) {
        (void)cudaGetLastError();
        return false;
    }
    return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

static ncclResult_t enqueue(nccl_state *s, const nccl_op_args *a, const void *in, void *out) {
    switch (a->kind) {
    case TS_COLL_ALL_REDUCE: return ncclAllReduce(in, out, a->count, a->type, a->op, s->comm, s->cs);
    case TS_COLL_BROADCAST: return ncclBroadcast(in, out, a->count, ncclUint8, a->peer, s->comm, s->cs);
    case TS_COLL_REDUCE: return ncclReduce(in, out, a->count, a->type, a->op, a->peer, s->comm, s->cs);
    case TS_COLL_ALL_GATHER: return ncclAllGather(in, out, a->count, ncclUint8, s->comm, s->cs);
    case TS_COLL_REDUCE_SCATTER: return ncclReduceScatter(in, out, a->count, a->type, a->op, s->comm, s->cs);
    case TS_COLL_SEND: return ncclSend(in, a->count, ncclUint8, a->peer, s->comm, s->cs);
    default: return ncclRecv(out, a->count, ncclUint8, a->peer, s->comm, s->cs);
    }
}

static ts_status run_op(nccl_state *s, const nccl_op_args *a) {
    const char *what = ts_coll_kind_name(a->kind);
    TS_TRY(check_broken(s, what));
    if (a->count == 0) return TS_OK;
    cudaStream_t compute;
    TS_TRY(ts__cuda_enter(s->dev, &compute));
    /* host buffers go through device memory (one block: in, then out unless in place) */
    const bool in_host = a->in && !on_device(a->in), out_host = a->out && !on_device(a->out);
    const bool inplace = a->in == a->out;
    void *in_dev = (void *)a->in, *out_dev = a->out, *stage = NULL;
    size_t stage_bytes = 0;
    size_t in_sz = 0;
    if (in_host || out_host) {
        in_sz = in_host && !inplace ? a->in_bytes : 0;
        size_t out_sz = out_host ? a->out_bytes : 0;
        if (inplace && in_host) out_sz = a->out_bytes > a->in_bytes ? a->out_bytes : a->in_bytes;
        stage_bytes = align256(in_sz) + out_sz;
        if (!(stage = ts__device_alloc(s->dev, stage_bytes)))
            return ts__error_prefix(TS_ERR_NOMEM, "nccl: staging a %s of %zu bytes through %s", what, stage_bytes,
                                    s->dev->name);
    }
    /* The communication stream waits for everything queued on the device so far: the buffers' producers,
     * and the last users of the staging block (the allocator reuses blocks in the compute stream's order,
     * and the block was freed before this record). */
    cudaError_t re = cudaEventRecord(s->ready, compute);
    if (re == cudaSuccess) re = cudaStreamWaitEvent(s->cs, s->ready, 0);
    if (re != cudaSuccess) {
        if (stage) ts__device_free(s->dev, stage, stage_bytes);
        return ts__cuda_status(s->dev, re, "cudaEventRecord (nccl: compute -> communication stream)");
    }
    if (stage) {
        unsigned char *p = stage;
        if (out_host) out_dev = p + align256(in_sz);
        if (in_host) in_dev = inplace ? out_dev : p;
        if (in_host) {
            /* all_gather's in may sit inside out (at this rank's block): stage it at the same place */
            if (a->kind == TS_COLL_ALL_GATHER && out_host && (const unsigned char *)a->in >= (unsigned char *)a->out &&
                (const unsigned char *)a->in < (unsigned char *)a->out + a->out_bytes)
                in_dev = (unsigned char *)out_dev + ((const unsigned char *)a->in - (unsigned char *)a->out);
            cudaError_t e = cudaMemcpyAsync(in_dev, a->in, a->in_bytes, cudaMemcpyHostToDevice, s->cs);
            if (e != cudaSuccess) {
                ts__device_free(s->dev, stage, stage_bytes);
                return ts__cuda_status(s->dev, e, "cudaMemcpyAsync (nccl staging)");
            }
        }
    }
    ts_status st = TS_OK;
    ncclResult_t r = enqueue(s, a, in_dev, out_dev);
    if (r != ncclSuccess && r != ncclInProgress) {
        st = nccl_error(s, TS_ERR_REMOTE, r, what);
        mark_broken(s, st);
    } else if (r == ncclInProgress) { /* a non-blocking communicator still enqueueing: until it has */
        st = wait_for(s, NULL, what, a->in_bytes, s->ctx->timeout_s);
    }
    /* wait (polling: timeout, abort, NCCL's errors) for the collective itself; only then copy a staged
     * result out — a copy into pageable host memory blocks the host until the stream reaches it, which
     * would wait out a hung peer with no timeout */
    if (st == TS_OK) {
        cudaError_t e = cudaEventRecord(s->done, s->cs);
        st = e == cudaSuccess ? wait_for(s, s->done, what, a->out_bytes ? a->out_bytes : a->in_bytes, s->ctx->timeout_s)
                              : ts__cuda_status(s->dev, e, "cudaEventRecord (nccl)");
    }
    if (st == TS_OK && out_host) {
        cudaError_t e = cudaMemcpyAsync(a->out, out_dev, a->out_bytes, cudaMemcpyDeviceToHost, s->cs);
        if (e == cudaSuccess) e = cudaStreamSynchronize(s->cs);
        if (e != cudaSuccess) st = ts__cuda_status(s->dev, e, "cudaMemcpyAsync (nccl staging)");
    }
    /* the communication stream is done with the staging block (its last event completed); after an
     * abort it may not be: the block is left to the process rather than reused under a kernel */
    if (stage && !s->broken) ts__device_free(s->dev, stage, stage_bytes);
    return st;
}

static ts_status nccl_all_reduce(void *st, void *buf, size_t count, ts_dtype dt, ts_reduce_op op) {
    nccl_op_args a = {TS_COLL_ALL_REDUCE, buf, buf, count * ts_dtype_size(dt), count * ts_dtype_size(dt), count, nccl_type(dt), nccl_op(op), -1};
    return run_op(st, &a);
}

static ts_status nccl_broadcast(void *st, void *buf, size_t count, ts_dtype dt, int root) {
    size_t b = count * ts_dtype_size(dt);
    nccl_op_args a = {TS_COLL_BROADCAST, buf, buf, b, b, b, ncclUint8, ncclSum, root};
    return run_op(st, &a);
}

static ts_status nccl_reduce(void *st, void *buf, size_t count, ts_dtype dt, ts_reduce_op op, int root) {
    size_t b = count * ts_dtype_size(dt);
    nccl_op_args a = {TS_COLL_REDUCE, buf, buf, b, b, count, nccl_type(dt), nccl_op(op), root};
    return run_op(st, &a);
}

static ts_status nccl_all_gather(void *st, void *out, const void *in, size_t count, ts_dtype dt) {
    nccl_state *s = st;
    size_t b = count * ts_dtype_size(dt);
    nccl_op_args a = {TS_COLL_ALL_GATHER, out, in, b, b * (size_t)s->ctx->world_size, b, ncclUint8, ncclSum, -1};
    return run_op(st, &a);
}

static ts_status nccl_reduce_scatter(void *st, void *out, const void *in, size_t count, ts_dtype dt, ts_reduce_op op) {
    nccl_state *s = st;
    size_t b = count * ts_dtype_size(dt);
    nccl_op_args a = {TS_COLL_REDUCE_SCATTER, out, in, b * (size_t)s->ctx->world_size, b, count, nccl_type(dt), nccl_op(op), -1};
    return run_op(st, &a);
}

static ts_status nccl_barrier(void *st) {
    nccl_state *s = st;
    float one = 1.0f; /* an all-reduce of one float (NCCL has no barrier), staged from the host */
    nccl_op_args a = {TS_COLL_ALL_REDUCE, &one, &one, sizeof one, sizeof one, 1, ncclFloat32, ncclSum, -1};
    ts_status r = run_op(s, &a);
    if (r == TS_OK && one != (float)s->ctx->world_size)
        return ts_error(TS_ERR_INTERNAL, "nccl (rank %d): barrier counted %g ranks of %d", s->ctx->rank, (double)one,
                        s->ctx->world_size);
    return r;
}

static ts_status nccl_send(void *st, const void *buf, size_t count, ts_dtype dt, int dst, int tag) {
    (void)tag;
    size_t b = count * ts_dtype_size(dt);
    nccl_op_args a = {TS_COLL_SEND, NULL, buf, b, 0, b, ncclUint8, ncclSum, dst};
    return run_op(st, &a);
}

static ts_status nccl_recv(void *st, void *buf, size_t count, ts_dtype dt, int src, int tag) {
    (void)tag;
    size_t b = count * ts_dtype_size(dt);
    nccl_op_args a = {TS_COLL_RECV, buf, NULL, 0, b, b, ncclUint8, ncclSum, src};
    return run_op(st, &a);
}

const ts__backend_ops ts__nccl_backend = {
    .name = "nccl",
    .init = nccl_init,
    .all_reduce = nccl_all_reduce,
    .broadcast = nccl_broadcast,
    .reduce = nccl_reduce,
    .all_gather = nccl_all_gather,
    .reduce_scatter = nccl_reduce_scatter,
    .barrier = nccl_barrier,
    .send = nccl_send,
    .recv = nccl_recv,
    .abort = nccl_abort,
    .destroy = nccl_destroy,
    .describe = nccl_describe,
    .reduces_bf16 = true,
    .device_buffers = true,
};
