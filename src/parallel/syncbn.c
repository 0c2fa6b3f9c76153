/*
 * parallel/syncbn.c — SyncBatchNorm (see include/tessera/ddp.h), after
 * torch.nn.SyncBatchNorm: BatchNorm2d whose training-mode batch statistics
 * are those of the union of every rank's batch.
 *
 * A SyncBatchNorm is a BatchNorm2d module converted in place by BatchNorm2d's
 * owner hook ts__batchnorm2d_convert (ts_nn_convert_sync_batchnorm): same
 * slots, same names, same tensors; its impl starts with BatchNorm2d's
 * ts__bn_config, so ts_batchnorm2d_get_config reads both kinds. Eval mode, a
 * NULL group or a group of one rank run exactly BatchNorm2d's op
 * (ts_batchnorm2d). Training with a larger group:
 *
 *   forward   local statistics with the device's batchnorm2d_stats kernel
 *             (momentum 1 into scratch "running" tensors gives the local mean
 *             and unbiased variance, each computed in double and rounded once)
 *             -> one all_gather of (count, mean[C], M2[C]) per rank as doubles
 *             (M2 = sum of squared deviations from the local mean)
 *             -> every rank combines them in rank order with Chan's pairwise
 *             update (no sum/sum-of-squares cancellation, ranks with 0 samples
 *             skipped), so the global mean, biased variance and the running
 *             statistics (unbiased variance) are bit-identical on all ranks
 *             -> batchnorm2d_apply with the global mean and invstd.
 *             (An all_gather, as torch, rather than one all_reduce of [sum,
 *             sumsq, count]: reduce ops here are f32 only, and float sums of
 *             squares lose the variance to cancellation when |mean| >> std;
 *             the gathered record is (2C+1) doubles per rank.)
 *   backward  batchnorm2d_backward in eval form with the global mean/invstd
 *             gives the local sum(dy) (= grad_bias share), invstd*sum(dy*(x-mean))
 *             (= grad_weight share) and w*invstd*dy; one all_reduce (SUM, f32)
 *             of [sum(dy), sum(dy*(x-mean))] when the input needs a gradient
 *             (as torch), then grad_input = w*invstd*dy + (x-mean)*a[c] + b[c]
 *             with a = -w invstd^3 sum(dy(x-mean))/N, b = -w invstd sum(dy)/N
 *             (batchnorm2d_apply into a scratch tensor, added with axpy).
 * grad_weight and grad_bias stay local shares (torch's choice): DDP's averaged
 * all-reduce of per-rank-mean losses then yields exactly the gradients of one
 * process over the whole batch.
 *
 * Collectives are issued on the calling thread in forward/backward order,
 * blocking; the group queues them behind DDP's asynchronous bucket
 * all-reduces in issue order, and every rank issues both in the same order.
 */
#include "autograd/autograd.h"
#include "core/internal.h"
#include "nn/module.h"
#include "tensor/tensor.h"
#include "device/k_ew.h"
#include "device/k_spatial.h"
#include "tessera/ddp.h"

#include <math.h>

typedef struct syncbn_impl {
    ts__bn_config bn;     /* first (nn/module.h); bn.momentum < 0: cumulative average */
    ts_process_group *pg; /* borrowed; NULL: plain BatchNorm2d */
} syncbn_impl;

/* ---- not synchronised: exactly BatchNorm2d ------------------------------------------------- */
/* The momentum of this step; *count = num_batches_tracked + 1 when the running stats update (else 0). */
static float step_momentum(const ts_module *m, int64_t *count) {
    const syncbn_impl *c = m->impl;
    float momentum = c->bn.momentum;
    *count = 0;
    if (m->training && c->bn.track) {
        *count = (int64_t)ts_tensor_item(m->buffers[2], 0) + 1;
        if (momentum < 0) momentum = 1.0f / (float)*count;
    }
    return momentum;
}

/* x: (N, C, H, W) -> (N, C, H, W), as BatchNorm2d's forward (src/nn/layers.c). */
static ts_status local_forward(ts_module *m, const ts_tensor *x, ts_tensor **out) {
    const syncbn_impl *c = m->impl;
    ts_tensor *rm = c->bn.track ? m->buffers[0] : NULL, *rv = c->bn.track ? m->buffers[1] : NULL;
    bool update = m->training && c->bn.track;
    int64_t count;
    float momentum = step_momentum(m, &count);
    TS_TRY(ts_batchnorm2d(x, m->params[0], m->params[1], rm, rv, m->training || !c->bn.track,
                          momentum < 0 ? 0 : momentum, c->bn.eps, out));
    if (update) {
        ts_status st = ts_tensor_from_host(m->buffers[2], &count, sizeof count);
        if (st != TS_OK) {
            ts_tensor_release(*out);
            *out = NULL;
            return st;
        }
    }
    return TS_OK;
}

/* ---- synchronised ---------------------------------------------------------------------------- */
/* A (C) parameter or statistic (NULL: absent): F32, (C), on x's device; running statistics
 * are updated in place, so they must be contiguous. */
static ts_status check_vec(const char *arg, const ts_tensor *t, const ts_tensor *x, bool contiguous) {
    if (!t) return TS_OK;
    TS_TRY(ts__check_f32("sync_batchnorm2d", arg, t));
    TS_TRY(ts__check_same_device("sync_batchnorm2d", x, t));
    char ts[64], xs[96];
    if (t->ndim != 1 || t->shape[0] != x->shape[1])
        return ts_error(TS_ERR_SHAPE, "sync_batchnorm2d: %s %s does not fit input %s (%lld channels)", arg,
                        ts_shape_str(t->ndim, t->shape, ts, sizeof ts), ts_shape_str(4, x->shape, xs, sizeof xs),
                        (long long)x->shape[1]);
    TS_ARG(!contiguous || ts_tensor_is_contiguous(t), "sync_batchnorm2d: %s must be contiguous (updated in place)",
           arg);
    return TS_OK;
}

/* Backward (see the top of the file). saved: x, mean, invstd (global, (C)), weight or NULL, the mean's
 * residual; p.i[0]: the global count N*H*W over all ranks; ctx: the process group (borrowed). */
static ts_status syncbn_backward(ts_node *n, ts_tensor *g_in, ts_tensor **gin) {
    const ts_tensor *x = n->saved[0], *mean = n->saved[1], *invstd = n->saved[2], *w = n->saved[3];
    const ts_tensor *mres = n->saved[4];
    ts_process_group *pg = n->ctx;
    ts_device *d = x->storage->device;
    const int64_t C = x->shape[1];
    const double total = (double)n->p.i[0];
    const bool local = ts_tensor_numel(x) > 0;
    ts_tensor *g = NULL, *sdy = NULL, *gw = NULL, *coef = NULL, *shift = NULL, *t = NULL;
    float *h = ts__malloc(sizeof(float) * (size_t)(6 * C)); /* sums[2C], invstd, w, coef, shift */
    ts_status st = h ? TS_OK : TS_ERR_NOMEM;
    if (st != TS_OK) return st;
    float *sums = h, *his = h + 2 * C, *hw = h + 3 * C, *hcoef = h + 4 * C, *hshift = h + 5 * C;

    TS_CHECK_GOTO(ts__contiguous(g_in, &g));
    TS_CHECK_GOTO(ts__zeros_like(mean, &sdy)); /* sum(dy): the local grad_bias */
    TS_CHECK_GOTO(ts__zeros_like(mean, &gw));  /* invstd * sum(dy (x - mean)): the local grad_weight */
    if (n->needs[0]) TS_CHECK_GOTO(ts__new_like(x, &gin[0]));
    /* eval form: mean/invstd are constants here, so gx = w invstd dy; the rest is added below */
    if (local) TS_CHECK_GOTO(d->k_spatial->batchnorm2d_backward(g, x, mean, mres, invstd, w, false, gin[0], gw, sdy));
    if (n->needs[0]) {
        TS_CHECK_GOTO(ts_tensor_to_host(sdy, sums, sizeof(float) * (size_t)C));
        TS_CHECK_GOTO(ts_tensor_to_host(gw, sums + C, sizeof(float) * (size_t)C));
        TS_CHECK_GOTO(ts_tensor_to_host(invstd, his, sizeof(float) * (size_t)C));
        for (int64_t c = 0; c < C; c++) sums[C + c] = (float)((double)sums[C + c] / (double)his[c]);
        TS_CHECK_GOTO(ts_all_reduce_buffer(pg, sums, (size_t)(2 * C), TS_F32, TS_REDUCE_SUM, NULL));
        if (local) {
            if (w) TS_CHECK_GOTO(ts_tensor_to_host(w, hw, sizeof(float) * (size_t)C));
            for (int64_t c = 0; c < C; c++) {
                double wv = w ? hw[c] : 1.0, is = his[c];
                hcoef[c] = (float)(-wv * is * is * is * (double)sums[C + c] / total);
                hshift[c] = (float)(-wv * is * (double)sums[c] / total);
            }
            TS_CHECK_GOTO(ts__new_like(mean, &coef));
            TS_CHECK_GOTO(ts__new_like(mean, &shift));
            TS_CHECK_GOTO(ts_tensor_from_host(coef, hcoef, sizeof(float) * (size_t)C));
            TS_CHECK_GOTO(ts_tensor_from_host(shift, hshift, sizeof(float) * (size_t)C));
            TS_CHECK_GOTO(ts__new_like(x, &t));
            /* t = (x - mean) * coef + shift */
            TS_CHECK_GOTO(d->k_spatial->batchnorm2d_apply(t, x, mean, mres, coef, NULL, shift));
            TS_CHECK_GOTO(d->k_ew->axpy(gin[0], 1.0f, t));
        }
    }
    if (n->needs[1]) gin[1] = gw, gw = NULL;
    if (n->needs[2]) gin[2] = sdy, sdy = NULL;
fail:
    ts_tensor_release(g);
    ts_tensor_release(sdy);
    ts_tensor_release(gw);
    ts_tensor_release(coef);
    ts_tensor_release(shift);
    ts_tensor_release(t);
    free(h);
    return st;
}

/* Training forward over the group (see the top of the file). */
static ts_status sync_forward(ts_module *m, const ts_tensor *x_in, ts_tensor **out) {
    const syncbn_impl *c = m->impl;
    ts_tensor *weight = m->params[0], *bias = m->params[1];
    ts_tensor *rm = c->bn.track ? m->buffers[0] : NULL, *rv = c->bn.track ? m->buffers[1] : NULL;
    if (x_in && (x_in->dtype == TS_BF16 || x_in->dtype == TS_F16)) { /* 16-bit activations (autocast): in float32 */
        ts_tensor *wide = NULL, *o = NULL;
        ts_status st = ts_to_dtype(x_in, TS_F32, &wide);
        if (st == TS_OK) st = sync_forward(m, wide, &o);
        if (st == TS_OK) st = ts_to_dtype(o, x_in->dtype, out);
        ts_tensor_release(wide);
        ts_tensor_release(o);
        return st;
    }
    TS_TRY(ts__check_f32("sync_batchnorm2d", "input", x_in));
    TS_TRY(ts__check_ndim("sync_batchnorm2d", "input", x_in, 4));
    TS_TRY(check_vec("weight", weight, x_in, false));
    TS_TRY(check_vec("bias", bias, x_in, false));
    TS_TRY(check_vec("running_mean", rm, x_in, true));
    TS_TRY(check_vec("running_var", rv, x_in, true));
    const int64_t C = x_in->shape[1], M = x_in->shape[0] * x_in->shape[2] * x_in->shape[3];
    const int world = ts_pg_size(c->pg);
    const size_t rec = (size_t)(2 * C + 1); /* doubles per rank: count, mean[C], M2[C] */
    int64_t count;
    const double mom = (double)step_momentum(m, &count);

    ts_status st = TS_OK;
    ts_device *d = x_in->storage->device;
    ts_tensor *x = NULL, *lmean = NULL, *lres = NULL, *lis = NULL, *lvar = NULL, *send = NULL, *recv = NULL;
    ts_tensor *mean = NULL, *mres = NULL, *invstd = NULL, *w = NULL, *b = NULL, *o = NULL;
    /* local mean, local var; global mean, invstd; the local, then the global mean's residual */
    float *hf = ts__malloc(sizeof(float) * (size_t)(5 * C));
    double *acc = ts__malloc(sizeof(double) * (size_t)(2 * C));
    if (!hf || !acc) {
        free(hf);
        free(acc);
        return TS_ERR_NOMEM;
    }
    TS_CHECK_GOTO(ts__contiguous(x_in, &x));
    TS_CHECK_GOTO(ts_tensor_zeros(ts_device_cpu(), TS_U8, 1, (int64_t[]){(int64_t)(rec * sizeof(double))}, &send));
    TS_CHECK_GOTO(
        ts_tensor_empty(ts_device_cpu(), TS_U8, 1, (int64_t[]){(int64_t)(world * rec * sizeof(double))}, &recv));
    if (M > 0) {
        /* momentum 1 into zeroed "running" tensors: lvar = the local unbiased variance */
        TS_CHECK_GOTO(ts__new(d, TS_F32, 1, &C, &lmean));
        TS_CHECK_GOTO(ts__new(d, TS_F32, 1, &C, &lres));
        TS_CHECK_GOTO(ts__new(d, TS_F32, 1, &C, &lis));
        TS_CHECK_GOTO(ts_tensor_zeros(d, TS_F32, 1, &C, &lvar));
        TS_CHECK_GOTO(d->k_spatial->batchnorm2d_stats(x, c->bn.eps, 1.0f, lmean, lres, lis, NULL, lvar));
        TS_CHECK_GOTO(ts_tensor_to_host(lmean, hf, sizeof(float) * (size_t)C));
        TS_CHECK_GOTO(ts_tensor_to_host(lvar, hf + C, sizeof(float) * (size_t)C));
        TS_CHECK_GOTO(ts_tensor_to_host(lres, hf + 4 * C, sizeof(float) * (size_t)C));
        double *s = ts_tensor_data(send);
        s[0] = (double)M;
        for (int64_t k = 0; k < C; k++) {
            s[1 + k] = (double)hf[k] + (double)hf[4 * C + k]; /* the local mean to ~48 bits */
            s[1 + C + k] = (double)hf[C + k] * (double)(M - 1);
        }
    }
    TS_CHECK_GOTO(ts_all_gather(c->pg, recv, send, NULL));

    /* Chan et al.'s pairwise combination, in rank order on every rank */
    const double *all = ts_tensor_data(recv);
    double n = 0;
    double *gmean = acc, *gm2 = acc + C;
    for (int64_t k = 0; k < 2 * C; k++) acc[k] = 0;
    for (int r = 0; r < world; r++) {
        const double *q = all + (size_t)r * rec;
        double nr = q[0];
        if (nr <= 0) continue;
        double tot = n + nr;
        for (int64_t k = 0; k < C; k++) {
            double delta = q[1 + k] - gmean[k];
            gmean[k] += delta * (nr / tot);
            gm2[k] += q[1 + C + k] + delta * delta * (n * nr / tot);
        }
        n = tot;
    }
    if (n <= 1) {
        char xs[96];
        st = ts_error(TS_ERR_SHAPE,
                      "sync_batchnorm2d: expected more than 1 value per channel when training, got %.0f over all %d "
                      "ranks (this rank's input %s)",
                      n, world, ts_shape_str(4, x->shape, xs, sizeof xs));
        goto fail;
    }
    float *hmean = hf + 2 * C, *his = hf + 3 * C, *hres = hf + 4 * C;
    for (int64_t k = 0; k < C; k++) {
        hmean[k] = (float)gmean[k];
        hres[k] = (float)(gmean[k] - (double)hmean[k]);
        his[k] = (float)(1.0 / sqrt(gm2[k] / n + (double)c->bn.eps));
    }
    TS_CHECK_GOTO(ts__new(d, TS_F32, 1, &C, &mean));
    TS_CHECK_GOTO(ts__new(d, TS_F32, 1, &C, &mres));
    TS_CHECK_GOTO(ts__new(d, TS_F32, 1, &C, &invstd));
    TS_CHECK_GOTO(ts_tensor_from_host(mean, hmean, sizeof(float) * (size_t)C));
    TS_CHECK_GOTO(ts_tensor_from_host(mres, hres, sizeof(float) * (size_t)C));
    TS_CHECK_GOTO(ts_tensor_from_host(invstd, his, sizeof(float) * (size_t)C));
    if (c->bn.track) { /* r = (1 - momentum) r + momentum * stat, unbiased variance (PyTorch's rule) */
        float *hrm = hf, *hrv = hf + C;
        TS_CHECK_GOTO(ts_tensor_to_host(rm, hrm, sizeof(float) * (size_t)C));
        TS_CHECK_GOTO(ts_tensor_to_host(rv, hrv, sizeof(float) * (size_t)C));
        for (int64_t k = 0; k < C; k++) {
            hrm[k] = (float)(mom * gmean[k] + (1.0 - mom) * hrm[k]);
            hrv[k] = (float)(mom * (gm2[k] / (n - 1)) + (1.0 - mom) * hrv[k]);
        }
        TS_CHECK_GOTO(ts_tensor_from_host(rm, hrm, sizeof(float) * (size_t)C));
        TS_CHECK_GOTO(ts_tensor_from_host(rv, hrv, sizeof(float) * (size_t)C));
        TS_CHECK_GOTO(ts_tensor_from_host(m->buffers[2], &count, sizeof count));
    }

    if (weight) TS_CHECK_GOTO(ts__contiguous(weight, &w));
    if (bias) TS_CHECK_GOTO(ts__contiguous(bias, &b));
    TS_CHECK_GOTO(ts__new_like(x, &o));
    if (ts_tensor_numel(x) > 0) TS_CHECK_GOTO(d->k_spatial->batchnorm2d_apply(o, x, mean, mres, invstd, w, b));
    const ts_tensor *in[3] = {x_in, weight, bias};
    ts_node *node = NULL;
    TS_CHECK_GOTO(ts__node_new("sync_batchnorm2d", syncbn_backward, 3, in, &node));
    if (node) {
        ts__node_save(node, x);
        ts__node_save(node, mean);
        ts__node_save(node, invstd);
        ts__node_save(node, w);
        ts__node_save(node, mres);
        node->p.i[0] = (int64_t)n;
        node->ctx = c->pg; /* borrowed: no free_ctx */
        TS_CHECK_GOTO(ts__node_attach(node, o));
    }
    *out = o;
    o = NULL;
fail:
    ts_tensor_release(x);
    ts_tensor_release(lmean);
    ts_tensor_release(lres);
    ts_tensor_release(lis);
    ts_tensor_release(lvar);
    ts_tensor_release(send);
    ts_tensor_release(recv);
    ts_tensor_release(mean);
    ts_tensor_release(mres);
    ts_tensor_release(invstd);
    ts_tensor_release(w);
    ts_tensor_release(b);
    ts_tensor_release(o);
    free(hf);
    free(acc);
    return st;
}

static ts_status syncbn_forward(ts_module *m, const ts_tensor *x, ts_tensor **out) {
    const syncbn_impl *c = m->impl;
    if (x && (x->ndim == 2 || x->ndim == 3)) { /* a converted BatchNorm1d's (N, C) or (N, C, L): as (N, C, L, 1) */
        ts_tensor *x4 = NULL, *y4 = NULL;
        TS_TRY(ts_reshape(x, 4, (int64_t[]){x->shape[0], x->shape[1], x->ndim == 3 ? x->shape[2] : 1, 1}, &x4));
        ts_status st = syncbn_forward(m, x4, &y4);
        if (st == TS_OK) st = ts_reshape(y4, x->ndim, x->shape, out);
        ts_tensor_release(x4);
        ts_tensor_release(y4);
        return st;
    }
    /* torch: need_sync = bn_training and self.training, and world size > 1 */
    if (!m->training || !c->pg || ts_pg_size(c->pg) <= 1) return local_forward(m, x, out);
    return sync_forward(m, x, out);
}

static const ts_module_vt syncbn_vt = {
    .name = "SyncBatchNorm", .kind = TS_MODULE_SYNC_BATCHNORM, .forward = syncbn_forward};

/* ---- conversion ----------------------------------------------------------------------------- */
typedef struct bn_list {
    ts_module **v;
    syncbn_impl **blocks; /* a new configuration block per module */
    int n, cap;
} bn_list;

/* Appends every BatchNorm2d, BatchNorm1d and SyncBatchNorm under m (m included), depth first,
 * each with a new configuration block (filled when it is swapped in). */
static ts_status collect(ts_module *m, bn_list *l) {
    ts_module_kind_id kind = ts_module_kind(m);
    if (kind == TS_MODULE_BATCHNORM2D || kind == TS_MODULE_BATCHNORM1D || kind == TS_MODULE_SYNC_BATCHNORM) {
        if (l->n == l->cap) {
            int cap = l->cap ? 2 * l->cap : 8;
            ts_module **v = realloc(l->v, sizeof *v * (size_t)cap);
            if (!v) return ts_error(TS_ERR_NOMEM, "ts_nn_convert_sync_batchnorm: out of memory");
            l->v = v;
            syncbn_impl **im = realloc(l->blocks, sizeof *im * (size_t)cap);
            if (!im) return ts_error(TS_ERR_NOMEM, "ts_nn_convert_sync_batchnorm: out of memory");
            l->blocks = im;
            l->cap = cap;
        }
        syncbn_impl *c = ts__calloc(1, sizeof *c);
        if (!c) return ts_error(TS_ERR_NOMEM, "ts_nn_convert_sync_batchnorm: out of memory");
        l->v[l->n] = m;
        l->blocks[l->n++] = c;
    }
    for (int i = 0; i < m->nchildren; i++) TS_TRY(collect(m->children[i], l));
    return TS_OK;
}

/* Gives m (a BatchNorm2d, BatchNorm1d or SyncBatchNorm) the configuration block c bound to pg; c is m's
 * from then on. */
static ts_status swap_in(ts_module *m, syncbn_impl *c, ts_process_group *pg) {
    c->pg = pg;
    if (ts_module_kind(m) == TS_MODULE_BATCHNORM2D || ts_module_kind(m) == TS_MODULE_BATCHNORM1D)
        return ts__batchnorm2d_convert(m, &syncbn_vt, c);
    /* a SyncBatchNorm (this file's type): rebind a copy (the old block may be a replica's borrowed one) */
    c->bn = ((const syncbn_impl *)m->impl)->bn;
    if (!m->impl_borrowed) free(m->impl);
    m->impl = c;
    m->impl_borrowed = false;
    return TS_OK;
}

ts_status ts_nn_convert_sync_batchnorm(ts_module *root, ts_process_group *pg) {
    TS_ARG(root, "ts_nn_convert_sync_batchnorm: NULL module");
    bn_list l = {0};
    ts_status st = collect(root, &l);
    for (int i = 0; i < l.n; i++) {
        /* all or nothing: swap only once everything is allocated (a swap cannot fail then:
         * collect took only modules of the two kinds) */
        if (st == TS_OK) st = swap_in(l.v[i], l.blocks[i], pg);
        if (st != TS_OK) free(l.blocks[i]);
    }
    free(l.v);
    free(l.blocks);
    return st;
}

ts_status ts_nn_sync_batchnorm2d_new(int64_t num_features, float eps, float momentum, bool affine,
                                     bool track_running_stats, ts_process_group *pg, ts_module **out) {
    TS_ARG(out, "ts_nn_sync_batchnorm2d_new: NULL out");
    TS_TRY(ts__batchnorm2d_check_args("ts_nn_sync_batchnorm2d_new", num_features, eps, momentum));
    ts_module *m = NULL;
    ts_status st = ts_nn_batchnorm2d_new(num_features, eps, momentum, affine, track_running_stats, &m);
    if (st != TS_OK) return ts__error_prefix(st, "ts_nn_sync_batchnorm2d_new");
    st = ts_nn_convert_sync_batchnorm(m, pg);
    if (st != TS_OK) {
        ts_module_free(m);
        return st;
    }
    *out = m;
    return TS_OK;
}
