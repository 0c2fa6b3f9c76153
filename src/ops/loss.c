/*
 * ops/loss.c — cross-entropy and mean-squared error, with PyTorch 1.13
 * semantics (log_softmax and softmax: activation.c).
 *
 * cross_entropy is fused: one kernel computes each row's max and log-sum-exp
 * (the softmax family's row reduction and formulas, device/k_elem.h) and the
 * loss, keeping them (N, 2); backward computes the gradient
 * (softmax - (1 - eps) onehot - eps / C without class weights) directly from
 * the logits and them. As torch.nn.functional.cross_entropy with class
 * indices (aten's cross_entropy_loss_label_smoothing and nll_loss): loss =
 * (1 - eps) weighted nll + eps / C * sum over classes of -w[c] log p[c];
 * targets equal to ignore_index skipped and not counted; the weighted mean
 * divides by the sum of the weights of the targets counted; reduction none
 * gives one value per sample (0 for ignored ones). Logits (N, C, d1, ...)
 * hold one sample per (n, d1, ...) with the classes along dim 1, as in
 * PyTorch; the kernel reads them at stride d1*... in place (no transpose).
 * ts_cross_entropy is ts_cross_entropy_ex with the default options.
 */
#include "autograd/autograd.h"
#include "ops/half.h"
#include "ops/loss.h"
#include "tensor/tensor.h"
#include "device/k_misc.h"
#include "ops/trace.h"
#include "tessera/ops.h"

/* ---- cross_entropy --------------------------------------------------------------------------------- */
/* saved: logits (N, C, d...), lse (N, d..., 2), target (N, d...), weight (C) or NULL; p.f[0] = label smoothing,
 * p.i[1] = ignore_index, p.i[2] = reduction */
static ts_status cross_entropy_backward(ts_node *n, ts_tensor *g_in, ts_tensor **gin) {
    ts_tensor *g = NULL;
    TS_TRY(ts__contiguous(g_in, &g));
    const ts_tensor *logits = ts__node_saved(n, 0);
    ts_status st = ts__new_like(logits, &gin[0]);
    if (st == TS_OK)
        st = g->storage->device->k_misc->cross_entropy_backward(gin[0], g, logits, ts__node_saved(n, 1),
                                                                  ts__node_saved(n, 2), ts__node_saved(n, 3),
                                                                  n->p.f[0], n->p.i[1], (ts_reduction)n->p.i[2]);
    ts_tensor_release(g);
    return st;
}

typedef struct ce_args {
    const ts_tensor *target;
    const ts_cross_entropy_opts *opts;
} ce_args;
static ts_status ce_thunk(const ts_tensor *a, const ts_tensor *b, const void *arg, ts_tensor **out) {
    (void)b;
    return ts_cross_entropy_ex(a, ((const ce_args *)arg)->target, ((const ce_args *)arg)->opts, out);
}

ts_status ts_cross_entropy_ex(const ts_tensor *logits_in, const ts_tensor *target_in, const ts_cross_entropy_opts *opts,
                              ts_tensor **out) {
    /* 16-bit logits: in float32; the loss in their dtype, or float32 under autocast (its float32 list) */
    if (ts__any_half(logits_in, NULL))
        return ts__half_op_as(ce_thunk, logits_in, NULL, &(ce_args){target_in, opts},
                              ts_get_autocast() == TS_BF16 ? TS_F32 : logits_in->dtype, out);
    const ts_cross_entropy_opts o = opts ? *opts : TS_CROSS_ENTROPY_OPTS_INIT;
    TS_TRY(ts__check_f32("cross_entropy", "logits", logits_in));
    TS_ARG(target_in, "cross_entropy: target is NULL");
    TS_ARG(out, "cross_entropy: NULL out");
    TS_TRY(ts__check_same_device("cross_entropy", logits_in, target_in));
    char a[96], b[96];
    const int nd = logits_in->ndim;
    if (nd < 2)
        return ts_error(TS_ERR_SHAPE, "cross_entropy: logits %s must be (N, C) or (N, C, d1, ...)",
                        ts_shape_str(nd, logits_in->shape, a, sizeof a));
    if (target_in->dtype != TS_I64)
        return ts_error(TS_ERR_DTYPE, "cross_entropy: target %s has dtype %s, expected int64 class indices",
                        ts_shape_str(target_in->ndim, target_in->shape, a, sizeof a), ts_dtype_name(target_in->dtype));
    /* the target is the logits' shape without the class dim */
    int64_t tshape[TS_MAX_DIMS];
    tshape[0] = logits_in->shape[0];
    for (int i = 2; i < nd; i++) tshape[i - 1] = logits_in->shape[i];
    bool fits = target_in->ndim == nd - 1;
    for (int i = 0; fits && i < nd - 1; i++) fits = target_in->shape[i] == tshape[i];
    if (!fits) {
        char c[96];
        return ts_error(TS_ERR_SHAPE, "cross_entropy: target %s does not fit logits %s (expected target %s)",
                        ts_shape_str(target_in->ndim, target_in->shape, a, sizeof a),
                        ts_shape_str(nd, logits_in->shape, b, sizeof b), ts_shape_str(nd - 1, tshape, c, sizeof c));
    }
    if (!(o.label_smoothing >= 0.0f && o.label_smoothing <= 1.0f))
        return ts_error(TS_ERR_INVALID_ARG, "cross_entropy: label_smoothing %g is outside [0, 1]",
                        (double)o.label_smoothing);
    if (o.reduction != TS_REDUCTION_MEAN && o.reduction != TS_REDUCTION_SUM && o.reduction != TS_REDUCTION_NONE)
        return ts_error(TS_ERR_INVALID_ARG, "cross_entropy: reduction %d is not TS_REDUCTION_MEAN, SUM or NONE",
                        (int)o.reduction);
    if (o.weight) {
        TS_TRY(ts__check_f32("cross_entropy", "weight", o.weight));
        TS_TRY(ts__check_same_device("cross_entropy", logits_in, o.weight));
        if (o.weight->ndim != 1 || o.weight->shape[0] != logits_in->shape[1])
            return ts_error(TS_ERR_SHAPE, "cross_entropy: weight %s does not fit logits %s (expected [%lld])",
                            ts_shape_str(o.weight->ndim, o.weight->shape, a, sizeof a),
                            ts_shape_str(nd, logits_in->shape, b, sizeof b), (long long)logits_in->shape[1]);
    }
    ts_device *d = logits_in->storage->device;
    ts_status st;
    ts_tensor *x = NULL, *t = NULL, *w = NULL, *lse = NULL, *loss = NULL;
    TS_CHECK_GOTO(ts__contiguous(logits_in, &x));
    TS_CHECK_GOTO(ts__contiguous(target_in, &t));
    if (o.weight) TS_CHECK_GOTO(ts__contiguous(o.weight, &w));
    int64_t lshape[TS_MAX_DIMS];
    memcpy(lshape, tshape, sizeof(int64_t) * (size_t)(nd - 1));
    lshape[nd - 1] = 2; /* each sample's max and log-sum-exp */
    TS_CHECK_GOTO(ts__new(d, TS_F32, nd, lshape, &lse));
    if (o.reduction == TS_REDUCTION_NONE)
        TS_CHECK_GOTO(ts__new(d, TS_F32, nd - 1, tshape, &loss));
    else
        TS_CHECK_GOTO(ts__new(d, TS_F32, 0, NULL, &loss));
    TS_CHECK_GOTO(d->k_misc->cross_entropy(loss, lse, x, t, w, o.label_smoothing, o.ignore_index, o.reduction));
    /* the target and the class weights are not differentiable: the node's one input is the logits */
    ts_node *n = NULL;
    TS_CHECK_GOTO(ts__node_new("cross_entropy", cross_entropy_backward, 1, &logits_in, &n));
    if (n) {
        ts__node_save(n, x);
        ts__node_save(n, lse);
        ts__node_save(n, t);
        ts__node_save(n, w);
        n->p.f[0] = o.label_smoothing;
        n->p.i[1] = o.ignore_index;
        n->p.i[2] = o.reduction;
        TS_CHECK_GOTO(ts__node_attach(n, loss));
    }
    const ts_tensor *tin[2] = {logits_in, target_in};
    TS_CHECK_GOTO(ts__trace_op(TS_OP_CROSS_ENTROPY, 2, tin, loss, &(ts__trace_attrs){.f = {o.label_smoothing}}));
    *out = loss;
    loss = NULL;
fail:
    ts_tensor_release(x);
    ts_tensor_release(t);
    ts_tensor_release(w);
    ts_tensor_release(lse);
    ts_tensor_release(loss);
    return st;
}

ts_status ts_cross_entropy(const ts_tensor *logits, const ts_tensor *target, float label_smoothing, ts_tensor **out) {
    ts_cross_entropy_opts o = TS_CROSS_ENTROPY_OPTS_INIT;
    o.label_smoothing = label_smoothing;
    return ts_cross_entropy_ex(logits, target, &o, out);
}

/* ---- mse_loss ---------------------------------------------------------------------------------------- */
/* saved: pred, target (same shape) */
static ts_status mse_backward(ts_node *n, ts_tensor *g, ts_tensor **gin) {
    const ts_tensor *p = ts__node_saved(n, 0), *t = ts__node_saved(n, 1);
    for (int i = 0; i < 2; i++)
        if (n->needs[i]) TS_TRY(ts__new_like(i ? t : p, &gin[i]));
    return g->storage->device->k_misc->mse_backward(gin[0], gin[1], g, p, t);
}

static ts_status mse_thunk(const ts_tensor *p, const ts_tensor *t, const void *arg, ts_tensor **out) {
    (void)arg;
    return ts_mse_loss(p, t, out);
}

/* 16-bit pred or target: on float32 copies (the loss float32 when their dtypes differ, ops/half.h, or under
 * autocast) */
ts_status ts_mse_loss(const ts_tensor *pred_in, const ts_tensor *target_in, ts_tensor **out) {
    if (ts__any_half(pred_in, target_in))
        return ts_get_autocast() == TS_BF16 ? ts__half_op_as(mse_thunk, pred_in, target_in, NULL, TS_F32, out)
                                            : ts__half_op(mse_thunk, pred_in, target_in, NULL, out);
    TS_TRY(ts__check_f32("mse_loss", "pred", pred_in));
    TS_TRY(ts__check_f32("mse_loss", "target", target_in));
    TS_ARG(out, "mse_loss: NULL out");
    TS_TRY(ts__check_same_device("mse_loss", pred_in, target_in));
    char a[96], b[96];
    if (!ts__same_shape(pred_in, target_in)) {
        /* PyTorch broadcasts the two (with a warning) and averages over the broadcast shape */
        ts_tensor *diff = NULL, *sq = NULL;
        ts_status st = ts_sub(pred_in, target_in, &diff);
        if (st != TS_OK)
            return ts__error_prefix(st, "mse_loss: pred %s and target %s",
                                    ts_shape_str(pred_in->ndim, pred_in->shape, a, sizeof a),
                                    ts_shape_str(target_in->ndim, target_in->shape, b, sizeof b));
        st = ts_mul(diff, diff, &sq);
        if (st == TS_OK) st = ts_mean(sq, out);
        ts_tensor_release(diff);
        ts_tensor_release(sq);
        return st;
    }
    ts_device *d = pred_in->storage->device;
    ts_status st;
    ts_tensor *p = NULL, *t = NULL, *o = NULL;
    TS_CHECK_GOTO(ts__contiguous(pred_in, &p));
    TS_CHECK_GOTO(ts__contiguous(target_in, &t));
    TS_CHECK_GOTO(ts__new(d, TS_F32, 0, NULL, &o));
    TS_CHECK_GOTO(d->k_misc->mse(o, p, t));
    const ts_tensor *in[2] = {pred_in, target_in};
    ts_node *n = NULL;
    TS_CHECK_GOTO(ts__node_new("mse_loss", mse_backward, 2, in, &n));
    if (n) {
        ts__node_save(n, p);
        ts__node_save(n, t);
        TS_CHECK_GOTO(ts__node_attach(n, o));
    }
    TS_CHECK_GOTO(ts__trace_op(TS_OP_MSE_LOSS, 2, in, o, NULL));
    *out = o;
    o = NULL;
fail:
    ts_tensor_release(p);
    ts_tensor_release(t);
    ts_tensor_release(o);
    return st;
}

/* ---- a sequence model's cross-entropy (ops/loss.h) ------------------------------------------------------ */
bool ts__class_last(const ts_tensor *logits, const ts_tensor *y) {
    int nd = ts_tensor_ndim(logits);
    if (nd < 3 || ts_tensor_ndim(y) != nd - 1) return false;
    for (int d = 0; d < nd - 1; d++)
        if (ts_tensor_shape(logits)[d] != ts_tensor_shape(y)[d]) return false;
    return true;
}

ts_status ts__cross_entropy_seq(const ts_tensor *logits, const ts_tensor *y, float label_smoothing, ts_tensor **out) {
    if (!ts__class_last(logits, y)) return ts_cross_entropy(logits, y, label_smoothing, out);
    int nd = ts_tensor_ndim(logits);
    int64_t v = ts_tensor_shape(logits)[nd - 1], rows = ts_tensor_numel(y), two[2] = {rows, v};
    ts_tensor *l2 = NULL, *y1 = NULL;
    ts_status st = ts_reshape(logits, 2, two, &l2);
    if (st == TS_OK) st = ts_reshape(y, 1, &rows, &y1);
    if (st == TS_OK) st = ts_cross_entropy(l2, y1, label_smoothing, out);
    ts_tensor_release(y1);
    ts_tensor_release(l2);
    return st;
}
