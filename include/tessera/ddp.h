/*
 * tessera/ddp.h — distributed data parallel, after torch.nn.parallel.DistributedDataParallel.
 *
 * Every rank holds a full replica of the model and feeds it its own share of
 * each global batch; DDP keeps the replicas identical by averaging gradients
 * during the backward pass:
 *
 *     ts_ddp *ddp;
 *     ts_ddp_options o = TS_DDP_OPTIONS_INIT;
 *     ts_ddp_new(model, pg, &o, &ddp);          // rank 0's parameters and buffers go to every rank
 *     for (...) {
 *         ts_ddp_forward(ddp, x, &logits);      // rank 0's buffers first (broadcast_buffers)
 *         ts_cross_entropy(logits, y, 0, &loss);
 *         ts_backward(loss, NULL, false);       // gradients are averaged over the ranks here
 *         ts_optimizer_step(opt);               // same update on every rank
 *         ts_optimizer_zero_grad(opt);
 *     }
 *
 * Buckets. The parameters that require grad are grouped, in REVERSE order of
 * registration (ts_module_parameters order; the last layers' gradients are
 * ready first), into buckets as PyTorch groups them: a parameter joins the open
 * bucket, and a bucket closes once it holds bucket_cap_mb MiB or more (the
 * first bucket: first_bucket_cap_mb, 1 MiB by default, so communication starts
 * early). So a bucket may exceed its cap by its last parameter, and a parameter
 * larger than the cap closes the bucket it joins. Each bucket is one flat
 * float32 buffer with a slot per parameter.
 *
 * Synchronisation. DDP registers a grad-ready hook on every such parameter.
 * When ts_backward reports a parameter's gradient final, the hook copies
 * .grad into its bucket slot; when a bucket's last gradient arrives it is
 * all-reduced asynchronously (ts_all_reduce_buffer, AVG: the sum divided by
 * the world size, or SUM) while backward goes on. Buckets are launched in
 * bucket index order on every rank: a bucket that is complete before an
 * earlier one is held until the earlier ones are launched. The hook of the
 * last parameter to report launches what is left, waits for every bucket in
 * order and copies the reduced values back into each parameter's .grad (a
 * copy, not a view: .grad stays an ordinary tensor that the optimizer and
 * zero_grad treat as usual). So when ts_backward returns, every rank holds
 * the same averaged gradients.
 *
 * Requirements (PyTorch's defaults, find_unused_parameters=False):
 *   - Every parameter that requires grad must receive a gradient in every
 *     backward that follows a synchronised ts_ddp_forward, on every rank.
 *     Otherwise the pass cannot complete (its buckets never fill); the next
 *     ts_ddp_forward returns TS_ERR_STATE naming the parameters that were not
 *     used, and ts_ddp_sync_status says so right after the backward. Freeze
 *     parameters you do not use (requires_grad false) before ts_ddp_new.
 *   - All ranks run the same model and call ts_ddp_forward / ts_backward the
 *     same number of times (equal batch counts: use ts_dist_sampler).
 *   - Move the model to its device before ts_ddp_new, and build the optimizer
 *     on the same parameter tensors.
 *   - Errors in the hooks (a failed collective) cannot fail ts_backward (the
 *     hook type returns nothing): they are recorded, reported by
 *     ts_ddp_sync_status and returned by the next ts_ddp_forward.
 *
 * Threads: one ts_ddp is used from one thread at a time (the one that runs
 * forward and backward); the process group's communication thread does the
 * reductions.
 *
 * Not provided yet (not declared here): find_unused_parameters, rebuilding buckets in the observed gradient order after the
 * first iteration, gradient_as_bucket_view, static_graph, communication hooks
 * (fp16 compression, PowerSGD), and model replicas on several devices per
 * process.
 */
#ifndef TESSERA_DDP_H
#define TESSERA_DDP_H

#include "dist.h"
#include "nn.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TS_DDP_OPTIONS_MAGIC 0x7e5ad001u
#define TS_DDP_OPTIONS_VERSION 1u

typedef struct ts_ddp_options {
    size_t size;                /* sizeof(ts_ddp_options) */
    unsigned int magic;         /* TS_DDP_OPTIONS_MAGIC */
    unsigned int version;       /* TS_DDP_OPTIONS_VERSION */
    double bucket_cap_mb;       /* > 0; default 25 (MiB) */
    double first_bucket_cap_mb; /* cap of bucket 0; default 1 (PyTorch's first bucket); <= 0: bucket_cap_mb */
    bool broadcast_buffers;     /* rank 0's buffers to every rank at each ts_ddp_forward; default true */
    bool average_gradients;     /* true (default): AVG, the sum divided by the world size; false: SUM */
    /* The buckets' all-reduce dtype: TS_F32 (default), or TS_BF16 — gradient compression as PyTorch's
     * bf16_compress_hook: each bucket is rounded to bfloat16, all-reduced in bfloat16 (half the bytes;
     * every hop sums in float32 and rounds back) and widened into the float32 gradients. Needs a backend
     * that reduces bfloat16 (the builtin one; ts_ddp_new refuses others). */
    ts_dtype comm_dtype;
} ts_ddp_options;

#define TS_DDP_OPTIONS_INIT                                                                                    \
    ((ts_ddp_options){sizeof(ts_ddp_options), TS_DDP_OPTIONS_MAGIC, TS_DDP_OPTIONS_VERSION, 25.0, 1.0, true, true, \
                      TS_F32})

typedef struct ts_ddp ts_ddp;

/* Wraps model for data-parallel training over pg. model and pg are borrowed and
 * must outlive the ts_ddp; opts (NULL: defaults) is copied. A collective: every
 * rank of pg calls it. Broadcasts every parameter and buffer from rank 0 (so
 * all ranks start identical), builds the buckets and registers the gradient
 * hooks (removed again by ts_ddp_free). Parameters that require grad must be
 * float32. *out is freed with ts_ddp_free. */
ts_status ts_ddp_new(ts_module *model, ts_process_group *pg, const ts_ddp_options *opts, ts_ddp **out);
/* Removes the hooks and frees the buckets (waiting for reductions still in
 * flight). The model keeps its current values. NULL is fine. */
void ts_ddp_free(ts_ddp *ddp);

/* Runs the wrapped model on x (borrowed; *out is a new reference). First
 * reports a previous backward that left its synchronisation incomplete or
 * failed (see the top of the file), then broadcasts rank 0's buffers when
 * broadcast_buffers (a collective), then calls ts_module_forward. Whether the
 * backward of this forward all-reduces is decided here, from
 * ts_ddp_set_require_sync's current value (as PyTorch decides in forward). */
ts_status ts_ddp_forward(ts_ddp *ddp, const ts_tensor *x, ts_tensor **out);

/* no_sync: while off, backward passes only accumulate gradients locally in
 * .grad (no communication); the first backward of a forward run with sync on
 * again all-reduces the accumulated gradients. Default on. Takes effect at the
 * next ts_ddp_forward. */
void ts_ddp_set_require_sync(ts_ddp *ddp, bool on);
bool ts_ddp_require_sync(const ts_ddp *ddp);

/* Uneven inputs, as torch's `with ddp.join():`. Every rank calls
 * ts_ddp_join_begin before its training loop; a rank that runs out of batches
 * calls ts_ddp_join, which keeps answering the other ranks' collectives (the
 * buffer broadcast and every gradient bucket, with zero gradients) until all
 * ranks have joined. The average still divides by the world size (PyTorch's
 * default), so a step where k of N ranks contribute gets the sum of their
 * gradients over N. When ts_ddp_join returns, the parameters and buffers of
 * the rank that ran the most steps (ties: the highest rank) have been
 * broadcast to all ranks, so the replicas are equal again; optimizer state
 * (momentum) of ranks that joined early is not updated. In join mode each
 * ts_ddp_forward does one extra small all-reduce (the count of ranks still
 * training), must be followed by a backward that reaches every parameter,
 * and no_sync is refused (TS_ERR_STATE). ts_ddp_join ends join mode. */
ts_status ts_ddp_join_begin(ts_ddp *ddp);
ts_status ts_ddp_join(ts_ddp *ddp);

/* Status of the gradient synchronisation of the latest synchronised backward:
 * TS_OK when it completed (or none was due), TS_ERR_STATE while parameters
 * are still missing (with a message naming them), or the error of a failed
 * reduction. Sets ts_last_error() when not TS_OK. Call it before
 * ts_optimizer_step to be sure the gradients are averaged. */
ts_status ts_ddp_sync_status(const ts_ddp *ddp);

/* The wrapped module (borrowed). */
ts_module *ts_ddp_module(ts_ddp *ddp);

/* ---- inspection (tests, debugging) ------------------------------------------------------- */
int ts_ddp_num_buckets(const ts_ddp *ddp);
/* The bucket of the i-th parameter in ts_module_parameters order, or -1 when
 * it does not require grad (or i is out of range). */
int ts_ddp_bucket_of(const ts_ddp *ddp, int param_index);
/* Number of float32 elements in bucket b (0 when out of range). */
int64_t ts_ddp_bucket_numel(const ts_ddp *ddp, int b);

typedef struct ts_ddp_stats {
    int64_t syncs;                  /* backward passes whose gradients were all-reduced */
    int64_t buckets_launched;       /* bucket all-reduces started */
    int64_t buckets_launched_early; /* ...of them, started before the pass's last gradient was ready */
    int64_t buckets_held;           /* buckets complete before an earlier one, held to keep the order */
    int64_t last_first_launch_at;   /* latest pass: gradients reported when bucket 0 was launched */
    int64_t last_num_reported;      /* latest pass: gradients reported in all */
    double comm_wait_s;             /* total time spent waiting for reductions at the end of backward */
} ts_ddp_stats;
void ts_ddp_get_stats(const ts_ddp *ddp, ts_ddp_stats *out);

/* ---- SyncBatchNorm -------------------------------------------------------------------------- */
/* torch.nn.SyncBatchNorm for (N, C, H, W) inputs: a BatchNorm2d whose batch
 * statistics in training mode are those of the union of every rank's batch,
 * so training at batch B/R on each of R ranks normalises like one process at
 * batch B. Type name "SyncBatchNorm"; parameters and buffers (and so state-dict
 * keys) are BatchNorm2d's: a BatchNorm2d checkpoint loads into it and back.
 *
 * Training mode with a group of two or more ranks (a collective: every rank of
 * pg runs the same forward and backward, in the same order):
 *   - forward: one all_gather of each rank's (count, mean, sum of squared
 *     deviations) per channel, in double; every rank combines them in rank
 *     order (Chan's parallel variance), so the global mean and biased variance
 *     used to normalise, and the running_mean/running_var update (unbiased
 *     variance, momentum as BatchNorm2d's, momentum < 0: cumulative) are
 *     bit-identical on all ranks. Ranks may hold different batch sizes,
 *     including 0 samples (the output is then empty); fewer than 2 values per
 *     channel over all ranks is TS_ERR_SHAPE on every rank.
 *   - backward: when the input needs a gradient, one all_reduce (SUM) of the
 *     per-channel sum(dy) and sum(dy * (x - mean)), so grad_input equals that of
 *     one BatchNorm2d over the concatenated batch. grad_weight and grad_bias
 *     are this rank's share (as in torch): summed over ranks they equal the
 *     single-process gradients, and with DDP (per-rank mean loss, averaged
 *     gradients) training matches one process at the whole batch. A failed
 *     collective fails the forward, or ts_backward (with the group's error).
 * These collectives run on pg in issue order after any asynchronous DDP bucket
 * all-reduce already issued, which is safe since all ranks issue both in the
 * same order. In eval mode, with pg NULL, or a group of one rank, it is
 * exactly BatchNorm2d (no communication). Input and parameters may live on any
 * device; the statistics travel through host buffers. Like torch's, it also takes
 * BatchNorm1d's inputs, (N, C) and (N, C, L) (statistics over N and L).
 *
 * pg is borrowed and must outlive the module and any graph it recorded. */
ts_status ts_nn_sync_batchnorm2d_new(int64_t num_features, float eps, float momentum, bool affine,
                                     bool track_running_stats, ts_process_group *pg, ts_module **out);

/* torch.nn.SyncBatchNorm.convert_sync_batchnorm: turns every BatchNorm2d and
 * BatchNorm1d in the tree under root (root included) into a SyncBatchNorm over pg, in place:
 * the module handles, names, parameter and buffer tensors (weight, bias,
 * running statistics, num_batches_tracked), eps, momentum, affine,
 * track_running_stats and the training flag stay as they were, so tensor
 * lists, optimizers and a ts_ddp built on the model keep working. A
 * SyncBatchNorm already in the tree is rebound to pg. As in torch, convert
 * after building the model and before ts_ddp_new (and build the optimizer
 * before or after; it sees the same tensors). All or nothing: on failure
 * (TS_ERR_NOMEM) the tree is unchanged. */
ts_status ts_nn_convert_sync_batchnorm(ts_module *root, ts_process_group *pg);

#ifdef __cplusplus
}
#endif
#endif /* TESSERA_DDP_H */
