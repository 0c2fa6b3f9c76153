/*
 * parallel/ddp.c — distributed data parallel (see include/tessera/ddp.h).
 *
 * State for one synchronised backward pass ("pass"):
 *   param.ready      the parameter's hook has fired in this pass
 *   bucket.pending   parameters of the bucket still to report
 *   next_launch      buckets [0, next_launch) have been launched (in order)
 *   reported         parameters reported so far; == nsync ends the pass
 * The hook of the parameter that makes reported == nsync launches what is
 * left, waits for every bucket in index order, copies the results back into
 * .grad and resets the pass. A pass that never completes (unused parameters)
 * is detected and cleaned up by the next ts_ddp_forward.
 *
 * Bucket layout: bucket b holds parameters members[0..n) (reverse
 * registration order); parameter p occupies buf[p.offset, p.offset + numel).
 *
 * Where buckets live: in host memory (buf), gradients copied out and back,
 * for any backend; or, when the group's backend takes device memory (nccl)
 * and every parameter is on that device (d->cdev), on the device (dbuf):
 * gradients are copied in and out on the device's stream and the backend
 * all-reduces the bucket in place, ordered after those copies, while the
 * rest of backward runs.
 */
#include "core/internal.h"
#include "core/timeline.h"
#include "device/device.h"
#include "distributed/pg.h"
#include "tensor/tensor.h"
#include "tessera/ddp.h"
#include "tessera/ops.h"

#include <math.h>
#include <stdio.h>

#define DDP_COALESCE_BYTES ((size_t)250 << 20) /* PyTorch's broadcast bucket for module states */
#define DDP_MAX_UNUSED_NAMED 8

typedef struct ddp_param {
    struct ts_ddp *ddp;
    ts_tensor *t;     /* borrowed from ddp->params */
    const char *name; /* borrowed from ddp->params */
    int bucket;       /* -1: does not require grad */
    size_t offset;    /* in the bucket, elements */
    size_t numel;
    int hook_id;
    bool ready;
} ddp_param;

typedef struct ddp_bucket {
    float *buf;
    uint16_t *buf16; /* comm_dtype TS_BF16: what goes on the wire */
    ts_tensor *dbuf;   /* on d->cdev instead of buf: float32 (numel) */
    ts_tensor *dbuf16; /* ... and its bfloat16 copy while it is all-reduced (comm_dtype TS_BF16) */
    size_t numel;
    int *members; /* parameter indices */
    int nmembers;
    int pending;
    ts_work *work;
    uint64_t trace_seq;  /* timeline on: its all-reduce's collective number in the flight recorder (0: none) */
    double trace_t0, trace_t1; /* ...when the communication thread started and ended it (0: not seen yet) */
} ddp_bucket;

struct ts_ddp {
    ts_module *model;
    ts_process_group *pg;
    ts_ddp_options opts;
    int rank, world;
    ts_device *cdev; /* buckets on this device (the group's, holding every parameter); NULL: host buckets */

    ts_tensor_list params, buffers;
    ddp_param *p;
    ddp_bucket *b;
    int nb, nsync;

    bool join_mode;    /* between ts_ddp_join_begin and ts_ddp_join */
    int64_t join_steps; /* ts_ddp_forward calls in join mode */
    bool require_sync; /* user's setting */
    bool sync_pass;    /* latched by ts_ddp_forward */
    int reported, next_launch;
    ts_status pass_status; /* first error of the current/latest pass */
    char errmsg[512];
    ts_ddp_stats stats;
};

/* ---- helpers -------------------------------------------------------------------------------- */
static size_t mb_to_bytes(double mb) { return (size_t)llround(mb * 1048576.0); }

/* Records the first error of a pass (with the current error message). */
static void pass_fail(ts_ddp *d, ts_status st, const char *what) {
    if (d->pass_status != TS_OK) return;
    d->pass_status = st;
    snprintf(d->errmsg, sizeof d->errmsg, "DDP (rank %d): %s: %s", d->rank, what, ts_last_error());
}

static void pass_reset(ts_ddp *d) {
    d->reported = 0;
    d->next_launch = 0;
    for (int i = 0; i < d->params.n; i++) d->p[i].ready = false;
    for (int b = 0; b < d->nb; b++) d->b[b].pending = d->b[b].nmembers;
}

/* Waits for (and frees) every launched bucket's work; returns the first error. */
static ts_status wait_all(ts_ddp *d) {
    ts_status first = TS_OK;
    double t0 = ts_time_now();
    for (int b = 0; b < d->nb; b++) {
        if (!d->b[b].work) continue;
        ts_status st = ts_work_wait(d->b[b].work, -1.0);
        if (st != TS_OK && first == TS_OK) {
            first = ts__error_prefix(st, "all-reduce of gradient bucket %d", b);
        }
        ts_work_free(d->b[b].work);
        d->b[b].work = NULL;
    }
    d->stats.comm_wait_s += ts_time_now() - t0;
    return first;
}

/* Starts the all-reduce of bucket bk (in comm_dtype: a bfloat16 bucket is rounded first). */
static ts_status launch(ts_ddp *d, ddp_bucket *bk) {
    ts_reduce_op op = d->opts.average_gradients ? TS_REDUCE_AVG : TS_REDUCE_SUM;
    if (d->cdev) {
        if (d->opts.comm_dtype != TS_BF16) return ts_all_reduce_buffer(d->pg, ts__ptr(bk->dbuf), bk->numel, TS_F32, op, &bk->work);
        ts_tensor_release(bk->dbuf16);
        bk->dbuf16 = NULL;
        TS_TRY(ts_to_dtype(bk->dbuf, TS_BF16, &bk->dbuf16));
        return ts_all_reduce_buffer(d->pg, ts__ptr(bk->dbuf16), bk->numel, TS_BF16, op, &bk->work);
    }
    if (!bk->buf16) return ts_all_reduce_buffer(d->pg, bk->buf, bk->numel, TS_F32, op, &bk->work);
    TS_TRY(ts_convert(bk->buf16, TS_BF16, bk->buf, TS_F32, bk->numel));
    return ts_all_reduce_buffer(d->pg, bk->buf16, bk->numel, TS_BF16, op, &bk->work);
}

/* ---- timeline (core/timeline.h): only while it records ---------------------------------------------- */
/* The collective number of the all-reduce this thread has just issued (the flight recorder's newest). */
static uint64_t trace_last_seq(ts_process_group *pg) {
    ts_pg_op_record rec[TS_PG_FLIGHT_RECORDER_SIZE];
    int n = 0;
    if (ts_pg_flight_recorder(pg, rec, TS_PG_FLIGHT_RECORDER_SIZE, &n) != TS_OK) return 0;
    for (int i = n - 1; i >= 0; i--)
        if (rec[i].async && rec[i].kind == TS_COLL_ALL_REDUCE) return rec[i].seq;
    return 0;
}

/* Notes the start and end of launched buckets whose all-reduce has ended, while the flight recorder's
 * ring (its last TS_PG_FLIGHT_RECORDER_SIZE operations) still holds them: called from every hook, so
 * collectives issued during backward (SyncBatchNorm's) do not push a bucket out before it is seen. */
static void trace_poll(ts_ddp *d) {
    bool want = false;
    for (int b = 0; b < d->nb && !want; b++) want = d->b[b].trace_seq && d->b[b].trace_t1 <= 0;
    ts_pg_op_record rec[TS_PG_FLIGHT_RECORDER_SIZE];
    int n = 0;
    if (!want || ts_pg_flight_recorder(d->pg, rec, TS_PG_FLIGHT_RECORDER_SIZE, &n) != TS_OK) return;
    for (int b = 0; b < d->nb; b++) {
        ddp_bucket *bk = &d->b[b];
        for (int i = n - 1; i >= 0 && bk->trace_seq && bk->trace_t1 <= 0; i--)
            if (rec[i].seq == bk->trace_seq && rec[i].kind == TS_COLL_ALL_REDUCE && rec[i].ended_s > 0) {
                bk->trace_t0 = rec[i].started_s > 0 ? rec[i].started_s : rec[i].issued_s;
                bk->trace_t1 = rec[i].ended_s;
            }
    }
}

/* After the pass's wait (wait0: when the last gradient came, before the last launches): the wait on the
 * trainer's lane, each bucket's all-reduce as the communication thread ran it on the comm lane with its
 * bytes, and their seconds into the ALLREDUCE counter. */
static void trace_buckets(ts_ddp *d, double wait0) {
    ts__tl_span(TS__TL_TRAINER, "allreduce wait", wait0);
    trace_poll(d);
    for (int b = 0; b < d->nb; b++) {
        ddp_bucket *bk = &d->b[b];
        size_t esize = bk->buf16 ? sizeof(uint16_t) : sizeof(float);
        if (bk->trace_seq && bk->trace_t1 > 0) {
            ts__tl_event(TS__TL_COMM, "allreduce", bk->trace_t0, bk->trace_t1, "bucket", b, "bytes",
                         (int64_t)(bk->numel * esize));
            ts__tl_count(TS__TL_ALLREDUCE_S, bk->trace_t1 - bk->trace_t0);
        }
        bk->trace_seq = 0;
        bk->trace_t0 = bk->trace_t1 = 0.0;
    }
}

/* Launches ready buckets in index order. */
static void launch_ready(ts_ddp *d) {
    while (d->pass_status == TS_OK && d->next_launch < d->nb && d->b[d->next_launch].pending == 0) {
        ddp_bucket *bk = &d->b[d->next_launch];
        ts_status st = launch(d, bk);
        if (st != TS_OK) {
            bk->work = NULL;
            pass_fail(d, st, "launching the all-reduce of a gradient bucket");
            return;
        }
        if (ts__tl_on()) bk->trace_seq = trace_last_seq(d->pg);
        if (d->next_launch == 0) d->stats.last_first_launch_at = d->reported;
        d->stats.buckets_launched++;
        if (d->reported < d->nsync) d->stats.buckets_launched_early++;
        d->next_launch++;
    }
}

/* Copies the reduced buckets back into the parameters' gradients (widening bfloat16 buckets first). */
static ts_status write_back(ts_ddp *d) {
    for (int b = 0; b < d->nb; b++)
        if (d->b[b].buf16) TS_TRY(ts_convert(d->b[b].buf, TS_F32, d->b[b].buf16, TS_BF16, d->b[b].numel));
    for (int b = 0; b < d->nb; b++) { /* device buckets: the widened bfloat16 result becomes dbuf (the next
                                        * pass's gradient copies cover every element of it) */
        ddp_bucket *bk = &d->b[b];
        if (!bk->dbuf16) continue;
        ts_tensor *wide = NULL;
        ts_status st = ts_to_dtype(bk->dbuf16, TS_F32, &wide);
        ts_tensor_release(bk->dbuf16);
        bk->dbuf16 = NULL;
        TS_TRY(st);
        ts_tensor_release(bk->dbuf);
        bk->dbuf = wide;
    }
    for (int i = 0; i < d->params.n; i++) {
        ddp_param *p = &d->p[i];
        if (p->bucket < 0) continue;
        const float *src = d->cdev ? NULL : d->b[p->bucket].buf + p->offset;
        size_t nbytes = p->numel * sizeof(float);
        ts_tensor *g = ts_tensor_grad(p->t);
        if (!g || !ts_tensor_is_contiguous(g)) {
            /* a gradient replaced since its hook ran: give it a fresh one */
            ts_tensor *fresh = NULL;
            TS_TRY(ts_tensor_empty(ts_tensor_device(p->t), TS_F32, ts_tensor_ndim(p->t), ts_tensor_shape(p->t),
                                   &fresh));
            ts_tensor_set_grad(p->t, fresh);
            ts_tensor_release(fresh);
            g = fresh;
        }
        ts_status st = d->cdev ? d->cdev->ops->copy_d2d(d->cdev, ts__ptr(g), ts__f32(d->b[p->bucket].dbuf) + p->offset,
                                                        nbytes)
                               : ts_tensor_from_host(g, src, nbytes);
        if (st != TS_OK) return ts__error_prefix(st, "writing the averaged gradient of %s", p->name);
    }
    return TS_OK;
}

/* The grad-ready hook: see the top of the file. */
static void grad_ready(ts_tensor *t, void *user) {
    ddp_param *p = user;
    ts_ddp *d = p->ddp;
    if (!d->sync_pass || d->pass_status != TS_OK) return;
    if (ts__tl_on()) trace_poll(d);
    if (p->ready) {
        ts_error(TS_ERR_STATE, "parameter %s reported its gradient twice in one pass", p->name);
        pass_fail(d, TS_ERR_STATE, "gradient hook");
        return;
    }
    ddp_bucket *bk = &d->b[p->bucket];
    ts_tensor *g = ts_tensor_grad(t);
    ts_status st = !g              ? ts_error(TS_ERR_STATE, "parameter %s has no gradient in its hook", p->name)
                   : !d->cdev      ? ts_tensor_to_host(g, bk->buf + p->offset, p->numel * sizeof(float))
                   : ts_tensor_is_contiguous(g) && ts_tensor_device(g) == d->cdev
                       ? d->cdev->ops->copy_d2d(d->cdev, ts__f32(bk->dbuf) + p->offset, ts__ptr(g), p->numel * sizeof(float))
                       : ts_error(TS_ERR_STATE, "parameter %s: its gradient is not a contiguous tensor on %s",
                                  p->name, d->cdev->name);
    if (st != TS_OK) {
        pass_fail(d, st, "copying a gradient into its bucket");
        return;
    }
    p->ready = true;
    d->reported++;
    double wait0 = d->reported == d->nsync ? ts__tl_now() : 0.0; /* timeline: the last launches + the wait */
    if (--bk->pending == 0) {
        if (p->bucket > d->next_launch) d->stats.buckets_held++;
        launch_ready(d);
    }
    if (d->reported < d->nsync) return;

    /* the last gradient of the pass: every bucket is complete and launched */
    d->stats.last_num_reported = d->reported;
    st = wait_all(d);
    if (wait0 > 0) trace_buckets(d, wait0);
    if (st == TS_OK) st = write_back(d);
    if (st != TS_OK) {
        pass_fail(d, st, "synchronising gradients");
        return;
    }
    d->stats.syncs++;
    pass_reset(d);
}

/* Broadcasts the tensors of l from rank root, coalesced into byte buffers of
 * up to DDP_COALESCE_BYTES (a larger tensor goes alone). */
static ts_status broadcast_list(ts_ddp *d, const ts_tensor_list *l, int root) {
    ts_status st = TS_OK;
    ts_tensor *flat = NULL;
    int i = 0;
    while (i < l->n) {
        size_t total = 0;
        int j = i;
        while (j < l->n && (j == i || total + ts_tensor_nbytes(l->tensors[j]) <= DDP_COALESCE_BYTES))
            total += ts_tensor_nbytes(l->tensors[j++]);
        int64_t n = (int64_t)total;
        TS_CHECK_GOTO(ts_tensor_empty(ts_device_cpu(), TS_U8, 1, &n, &flat));
        unsigned char *buf = ts_tensor_data(flat);
        size_t off = 0;
        if (d->rank == root)
            for (int k = i; k < j; k++) {
                size_t nb = ts_tensor_nbytes(l->tensors[k]);
                TS_CHECK_GOTO(ts_tensor_to_host(l->tensors[k], buf + off, nb));
                off += nb;
            }
        if (total > 0) TS_CHECK_GOTO(ts_broadcast(d->pg, flat, root, NULL));
        off = 0;
        if (d->rank != root)
            for (int k = i; k < j; k++) {
                size_t nb = ts_tensor_nbytes(l->tensors[k]);
                st = ts_tensor_from_host(l->tensors[k], buf + off, nb);
                if (st != TS_OK) {
                    ts__error_prefix(st, "DDP: receiving %s from rank %d", l->names[k], root);
                    goto fail;
                }
                off += nb;
            }
        ts_tensor_release(flat);
        flat = NULL;
        i = j;
    }
fail:
    ts_tensor_release(flat);
    return st;
}

/* TS_LOG_LEVEL=info (rank 0): the bucket layout, each bucket's bytes and its first and last parameter in
 * gradient order. */
static void log_buckets(const ts_ddp *d) {
    if (d->rank != 0 || ts_log_get_level() > TS_LOG_INFO) return;
    ts_log(TS_LOG_INFO, "DDP: %d bucket%s (caps %.3g MiB first, %.3g MiB), %s all-reduce, buckets in %s memory", d->nb,
           d->nb == 1 ? "" : "s", d->opts.first_bucket_cap_mb > 0 ? d->opts.first_bucket_cap_mb : d->opts.bucket_cap_mb,
           d->opts.bucket_cap_mb, ts_dtype_name(d->opts.comm_dtype), d->cdev ? d->cdev->name : "host");
    for (int b = 0; b < d->nb; b++) {
        const char *first = NULL, *last = NULL;
        int count = 0;
        for (int i = d->params.n - 1; i >= 0; i--) /* gradient order: last registered first */
            if (d->p[i].bucket == b) {
                if (!first) first = d->p[i].name;
                last = d->p[i].name;
                count++;
            }
        ts_log(TS_LOG_INFO, "DDP: bucket %d: %zu bytes, %d parameter%s, %s ... %s", b, d->b[b].numel * sizeof(float),
               count, count == 1 ? "" : "s", first ? first : "", last ? last : "");
    }
}

/* Groups the parameters that require grad into buckets (see ddp.h). */
static ts_status build_buckets(ts_ddp *d) {
    size_t cap = mb_to_bytes(d->opts.bucket_cap_mb);
    size_t first_cap = d->opts.first_bucket_cap_mb > 0 ? mb_to_bytes(d->opts.first_bucket_cap_mb) : cap;
    if (cap == 0) cap = 1;
    if (first_cap == 0) first_cap = 1;
    /* pass 1: assign bucket indices and offsets. PyTorch's rule (compute_bucket_assignment_by_size): a
     * parameter joins the open bucket, which closes once it holds its cap or more — so the parameter that
     * crosses the cap is in the bucket, and a large layer next to the output (the reference CNN's fc1,
     * 1.6 MB) shares the early first bucket instead of waiting for the last gradients in the next one. */
    int nb = 0;
    size_t cur = 0;
    bool open = false;
    for (int i = d->params.n - 1; i >= 0; i--) {
        ddp_param *p = &d->p[i];
        if (p->bucket < 0) continue;
        if (!open) {
            nb++;
            cur = 0;
            open = true;
        }
        p->bucket = nb - 1;
        p->offset = cur / sizeof(float);
        cur += p->numel * sizeof(float);
        if (cur >= (nb == 1 ? first_cap : cap)) open = false;
    }
    d->nb = nb;
    if (nb == 0) return TS_OK;
    d->b = ts__calloc((size_t)nb, sizeof *d->b);
    if (!d->b) return TS_ERR_NOMEM;
    for (int i = 0; i < d->params.n; i++) {
        ddp_param *p = &d->p[i];
        if (p->bucket < 0) continue;
        ddp_bucket *bk = &d->b[p->bucket];
        bk->nmembers++;
        if (p->offset + p->numel > bk->numel) bk->numel = p->offset + p->numel;
    }
    for (int b = 0; b < nb; b++) {
        ddp_bucket *bk = &d->b[b];
        bk->members = ts__calloc((size_t)bk->nmembers, sizeof(int));
        if (!bk->members) return TS_ERR_NOMEM;
        bk->nmembers = 0;
        if (d->cdev) {
            int64_t n = (int64_t)(bk->numel ? bk->numel : 1);
            TS_TRY(ts_tensor_zeros(d->cdev, TS_F32, 1, &n, &bk->dbuf));
            continue;
        }
        bk->buf = ts__calloc(bk->numel ? bk->numel : 1, sizeof(float));
        if (!bk->buf) return TS_ERR_NOMEM;
        if (d->opts.comm_dtype == TS_BF16 && !(bk->buf16 = ts__calloc(bk->numel ? bk->numel : 1, sizeof(uint16_t))))
            return TS_ERR_NOMEM;
    }
    for (int i = d->params.n - 1; i >= 0; i--) {
        ddp_param *p = &d->p[i];
        if (p->bucket >= 0) d->b[p->bucket].members[d->b[p->bucket].nmembers++] = i;
    }
    return TS_OK;
}

/* ---- public API ------------------------------------------------------------------------------------ */
ts_status ts_ddp_new(ts_module *model, ts_process_group *pg, const ts_ddp_options *opts, ts_ddp **out) {
    TS_ARG(model && pg && out, "ts_ddp_new: NULL argument");
    *out = NULL;
    ts_ddp_options o = TS_DDP_OPTIONS_INIT;
    if (opts) {
        if (opts->size != sizeof(ts_ddp_options) || opts->magic != TS_DDP_OPTIONS_MAGIC ||
            opts->version != TS_DDP_OPTIONS_VERSION)
            return ts_error(TS_ERR_INVALID_ARG,
                            "ts_ddp_new: options not initialised with TS_DDP_OPTIONS_INIT (size %zu, magic 0x%x, "
                            "version %u)",
                            opts->size, opts->magic, opts->version);
        o = *opts;
    }
    if (!(o.bucket_cap_mb > 0) || !isfinite(o.bucket_cap_mb) || !isfinite(o.first_bucket_cap_mb))
        return ts_error(TS_ERR_INVALID_ARG, "ts_ddp_new: bucket_cap_mb must be > 0 (got %g)", o.bucket_cap_mb);
    if (o.comm_dtype != TS_F32 && o.comm_dtype != TS_BF16)
        return ts_error(TS_ERR_INVALID_ARG, "ts_ddp_new: comm_dtype %s (want float32 or bfloat16)",
                        ts_dtype_name(o.comm_dtype));
    if (o.comm_dtype == TS_BF16 && !ts_pg_reduces_dtype(pg, TS_BF16))
        return ts_error(TS_ERR_UNSUPPORTED, "ts_ddp_new: the %s backend cannot all-reduce bfloat16 gradients (use the "
                        "builtin backend, or float32 communication)", ts_pg_backend_name(pg));

    ts_status st = TS_OK;
    ts_ddp *d = ts__calloc(1, sizeof *d);
    if (!d) return TS_ERR_NOMEM;
    d->model = model;
    d->pg = pg;
    d->opts = o;
    d->rank = ts_pg_rank(pg);
    d->world = ts_pg_size(pg);
    d->require_sync = d->sync_pass = true;
    d->params = d->buffers = TS_TENSOR_LIST_INIT;
    TS_CHECK_GOTO(ts_module_parameters(model, &d->params));
    TS_CHECK_GOTO(ts_module_buffers(model, &d->buffers));

    d->p = ts__calloc((size_t)(d->params.n ? d->params.n : 1), sizeof *d->p);
    if (!d->p) TS_CHECK_GOTO(TS_ERR_NOMEM);
    for (int i = 0; i < d->params.n; i++) {
        ddp_param *p = &d->p[i];
        p->ddp = d;
        p->t = d->params.tensors[i];
        p->name = d->params.names[i];
        p->numel = (size_t)ts_tensor_numel(p->t);
        p->bucket = ts_tensor_requires_grad(p->t) ? 0 : -1;
        if (p->bucket < 0) continue;
        if (ts_tensor_dtype(p->t) != TS_F32)
            TS_CHECK_GOTO(ts_error(TS_ERR_DTYPE, "ts_ddp_new: parameter %s is %s; DDP reduces float32 gradients",
                                   p->name, ts_dtype_name(ts_tensor_dtype(p->t))));
        d->nsync++;
    }

    /* every rank starts from rank 0's parameters and buffers */
    st = broadcast_list(d, &d->params, 0);
    if (st == TS_OK) st = broadcast_list(d, &d->buffers, 0);
    if (st != TS_OK) {
        ts__error_prefix(st, "ts_ddp_new: initial broadcast from rank 0 (rank %d of %d)", d->rank, d->world);
        goto fail;
    }
    /* buckets on the group's device when the backend takes its memory and every parameter is there */
    d->cdev = ts__pg_device(pg);
    for (int i = 0; i < d->params.n && d->cdev; i++)
        if (d->p[i].bucket >= 0 && ts_tensor_device(d->p[i].t) != d->cdev) d->cdev = NULL;
    TS_CHECK_GOTO(build_buckets(d));
    log_buckets(d);
    pass_reset(d);
    for (int i = 0; i < d->params.n; i++) {
        ddp_param *p = &d->p[i];
        if (p->bucket < 0) continue;
        p->hook_id = ts_tensor_add_grad_ready_hook(p->t, grad_ready, p);
        if (p->hook_id <= 0) TS_CHECK_GOTO(ts_error(TS_ERR_NOMEM, "ts_ddp_new: adding a gradient hook"));
    }
    *out = d;
    return TS_OK;
fail:
    ts_ddp_free(d);
    return st;
}

void ts_ddp_free(ts_ddp *d) {
    if (!d) return;
    if (d->b) {
        (void)wait_all(d);
        for (int b = 0; b < d->nb; b++) {
            free(d->b[b].buf);
            free(d->b[b].buf16);
            ts_tensor_release(d->b[b].dbuf);
            ts_tensor_release(d->b[b].dbuf16);
            free(d->b[b].members);
        }
        free(d->b);
    }
    if (d->p) {
        for (int i = 0; i < d->params.n; i++)
            if (d->p[i].hook_id > 0) ts_tensor_remove_grad_ready_hook(d->p[i].t, d->p[i].hook_id);
        free(d->p);
    }
    ts_tensor_list_clear(&d->params);
    ts_tensor_list_clear(&d->buffers);
    free(d);
}

/* The message for a pass whose parameters did not all report. */
static ts_status unused_error(const ts_ddp *d) {
    char names[384];
    size_t len = 0;
    int missing = 0;
    names[0] = '\0';
    for (int i = 0; i < d->params.n; i++) {
        const ddp_param *p = &d->p[i];
        if (p->bucket < 0 || p->ready) continue;
        if (missing < DDP_MAX_UNUSED_NAMED && len < sizeof names) {
            int w = snprintf(names + len, sizeof names - len, "%s%s", missing ? ", " : "", p->name);
            if (w > 0) len += (size_t)w;
        } else if (missing == DDP_MAX_UNUSED_NAMED && len < sizeof names) {
            int w = snprintf(names + len, sizeof names - len, ", ...");
            if (w > 0) len += (size_t)w;
        }
        missing++;
    }
    return ts_error(TS_ERR_STATE,
                    "DDP (rank %d): parameters %s were not used in the loss of the previous backward (%d of %d "
                    "parameters that require grad received no gradient): DDP needs every parameter that requires "
                    "grad to take part in every forward and backward (PyTorch's find_unused_parameters=False); "
                    "set requires_grad false on unused parameters before ts_ddp_new",
                    d->rank, names, missing, d->nsync);
}

ts_status ts_ddp_sync_status(const ts_ddp *d) {
    TS_ARG(d, "ts_ddp_sync_status: NULL ddp");
    if (d->pass_status != TS_OK) return ts_error(d->pass_status, "%s", d->errmsg);
    if (d->reported > 0) return unused_error(d);
    return TS_OK;
}

ts_status ts_ddp_forward(ts_ddp *d, const ts_tensor *x, ts_tensor **out) {
    TS_ARG(d && x && out, "ts_ddp_forward: NULL argument");
    *out = NULL;
    /* 1. a previous pass that failed or did not complete */
    if (d->pass_status != TS_OK || d->reported > 0) {
        ts_status st = ts_ddp_sync_status(d);
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", ts_last_error());
        (void)wait_all(d); /* buckets already launched are matched by the other ranks */
        pass_reset(d);
        d->pass_status = TS_OK;
        d->errmsg[0] = '\0';
        return ts_error(st, "%s", msg);
    }
    /* 2. join mode: tell the joined ranks that this one is still training */
    if (d->join_mode) {
        if (!d->require_sync)
            return ts_error(TS_ERR_STATE, "ts_ddp_forward: no_sync (require_sync false) is not supported between "
                                          "ts_ddp_join_begin and ts_ddp_join");
        float active = 1.0f;
        ts_status st = ts_all_reduce_buffer(d->pg, &active, 1, TS_F32, TS_REDUCE_SUM, NULL);
        if (st != TS_OK) return ts__error_prefix(st, "ts_ddp_forward: join: counting the active ranks");
        d->join_steps++;
    }
    /* 3. rank 0's buffers */
    if (d->opts.broadcast_buffers && d->world > 1 && d->buffers.n > 0) {
        ts_status st = broadcast_list(d, &d->buffers, 0);
        if (st != TS_OK) return ts__error_prefix(st, "ts_ddp_forward: broadcasting buffers from rank 0");
    }
    /* 4. the model */
    d->sync_pass = d->require_sync;
    return ts_module_forward(d->model, x, out);
}

/* ---- join (uneven inputs) ------------------------------------------------------------------------ */
ts_status ts_ddp_join_begin(ts_ddp *d) {
    TS_ARG(d, "ts_ddp_join_begin: NULL ddp");
    if (d->join_mode) return ts_error(TS_ERR_STATE, "ts_ddp_join_begin: already in join mode");
    if (d->reported > 0 || d->pass_status != TS_OK)
        return ts_error(TS_ERR_STATE, "ts_ddp_join_begin: the previous backward did not complete its synchronisation");
    d->join_mode = true;
    d->join_steps = 0;
    return TS_OK;
}

ts_status ts_ddp_join(ts_ddp *d) {
    TS_ARG(d, "ts_ddp_join: NULL ddp");
    if (!d->join_mode) return ts_error(TS_ERR_STATE, "ts_ddp_join: call ts_ddp_join_begin on every rank first");
    if (d->reported > 0 || d->pass_status != TS_OK) return ts_ddp_sync_status(d);
    d->join_mode = false;
    ts_status st = TS_OK;
    ts_tensor *steps = NULL, *all = NULL;
    /* shadow the active ranks' steps until every rank has joined */
    for (;;) {
        float active = 0.0f;
        st = ts_all_reduce_buffer(d->pg, &active, 1, TS_F32, TS_REDUCE_SUM, NULL);
        if (st != TS_OK) return ts__error_prefix(st, "ts_ddp_join: counting the active ranks");
        if (active == 0.0f) break;
        if (d->opts.broadcast_buffers && d->world > 1 && d->buffers.n > 0) {
            st = broadcast_list(d, &d->buffers, 0);
            if (st != TS_OK) return ts__error_prefix(st, "ts_ddp_join: shadowing the buffer broadcast");
        }
        for (int b = 0; b < d->nb && st == TS_OK; b++) {
            if (d->b[b].dbuf)
                st = ts_tensor_fill_(d->b[b].dbuf, 0.0f);
            else
                memset(d->b[b].buf, 0, d->b[b].numel * sizeof(float));
            if (st == TS_OK) st = launch(d, &d->b[b]);
            if (st != TS_OK) d->b[b].work = NULL;
        }
        ts_status st2 = wait_all(d);
        if (st == TS_OK) st = st2;
        if (st != TS_OK) return ts__error_prefix(st, "ts_ddp_join: shadowing the gradient all-reduce");
    }
    /* the rank that trained longest (ties: the highest rank) holds the final model */
    int64_t one = 1, world = d->world;
    TS_CHECK_GOTO(ts_tensor_from_data(ts_device_cpu(), TS_I64, 1, &one, &d->join_steps, &steps));
    TS_CHECK_GOTO(ts_tensor_zeros(ts_device_cpu(), TS_I64, 1, &world, &all));
    TS_CHECK_GOTO(ts_all_gather(d->pg, all, steps, NULL));
    const int64_t *n = ts_tensor_data(all);
    int root = 0;
    for (int r = 1; r < d->world; r++)
        if (n[r] >= n[root]) root = r;
    TS_CHECK_GOTO(broadcast_list(d, &d->params, root));
    TS_CHECK_GOTO(broadcast_list(d, &d->buffers, root));
fail:
    if (st != TS_OK) ts__error_prefix(st, "ts_ddp_join");
    ts_tensor_release(steps);
    ts_tensor_release(all);
    return st;
}

void ts_ddp_set_require_sync(ts_ddp *d, bool on) {
    if (d) d->require_sync = on;
}
bool ts_ddp_require_sync(const ts_ddp *d) { return d && d->require_sync; }
ts_module *ts_ddp_module(ts_ddp *d) { return d ? d->model : NULL; }

int ts_ddp_num_buckets(const ts_ddp *d) { return d ? d->nb : 0; }

int ts_ddp_bucket_of(const ts_ddp *d, int i) {
    if (!d || i < 0 || i >= d->params.n) return -1;
    return d->p[i].bucket;
}

int64_t ts_ddp_bucket_numel(const ts_ddp *d, int b) {
    if (!d || b < 0 || b >= d->nb) return 0;
    return (int64_t)d->b[b].numel;
}

void ts_ddp_get_stats(const ts_ddp *d, ts_ddp_stats *out) {
    if (!out) return;
    memset(out, 0, sizeof *out);
    if (d) *out = d->stats;
}
