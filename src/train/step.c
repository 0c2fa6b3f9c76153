/*
 * train/step.c — one training step, evaluation over a batch source, and the
 * optimizer / learning-rate schedule by name (tessera/train.h).
 */
#include "train/strategy.h"

#include <math.h>
#include <strings.h>

ts_status ts_train_step(ts_strategy *s, ts_optimizer *opt, const ts_tensor *x, const ts_tensor *y,
                        float label_smoothing, float *loss) {
    TS_ARG(s && opt && x && y, "ts_train_step: NULL argument");
    ts_status st = ts_strategy_forward_backward(s, x, y, label_smoothing, loss);
    if (st == TS_OK) st = ts_optimizer_step(opt);
    ts_optimizer_zero_grad(opt);
    return st;
}

/* Scores the first `real` samples' rows of logits (rows, c) on the host, `per` rows to a sample (a sequence
 * model's positions; 1 for a classifier): top-1 and top-5 hits, the summed cross-entropy and (confusion !=
 * NULL, classes x classes, row = label, column = prediction) counts. */
static ts_status score_rows(ts_tensor *logits, const ts_batch *b, int64_t per, ts_eval_result *r, double *loss_sum,
                            int64_t *confusion, int64_t classes) {
    const float *p = ts_tensor_data_f32(logits);
    const int64_t *lab = ts_tensor_data(b->y);
    int64_t c = ts_tensor_dim(logits, 1);
    if (confusion && c > classes)
        return ts_error(TS_ERR_SHAPE, "evaluation: the model has %lld classes, the confusion matrix %lld",
                        (long long)c, (long long)classes);
    for (int64_t i = 0; i < b->real * per; i++) {
        const float *row = p + i * c;
        if (lab[i] < 0 || lab[i] >= c)
            return ts_error(TS_ERR_FORMAT, "evaluation: sample %lld (row %lld of batch %lld) has label %lld, but the "
                                           "model has %lld classes",
                            (long long)(b->samples ? b->samples[i / per] : i / per), (long long)i, (long long)b->index,
                            (long long)lab[i], (long long)c);
        int64_t best = 0, above = 0; /* above: classes ranked before the label (ties: the lower index first) */
        for (int64_t k = 1; k < c; k++)
            if (row[k] > row[best]) best = k;
        float mx = row[best], v = row[lab[i]];
        double se = 0.0;
        for (int64_t k = 0; k < c; k++) {
            se += exp((double)row[k] - (double)mx);
            above += row[k] > v || (row[k] == v && k < lab[i]);
        }
        *loss_sum += log(se) + (double)mx - (double)v;
        r->correct += best == lab[i];
        r->correct_top5 += above < 5;
        if (confusion) confusion[lab[i] * classes + best]++;
    }
    return TS_OK;
}

/* A sequence model's logits (B, T, ..., V) for labels (B, T, ...) as (B*T*..., V) rows (*logits replaced). */
static ts_status sequence_rows(ts_tensor **logits, const ts_tensor *y) {
    if (!ts__class_last(*logits, y)) return TS_OK;
    int nd = ts_tensor_ndim(*logits);
    int64_t two[2] = {ts_tensor_numel(y), ts_tensor_shape(*logits)[nd - 1]};
    ts_tensor *rows = NULL;
    TS_TRY(ts_reshape(*logits, 2, two, &rows));
    ts_tensor_release(*logits);
    *logits = rows;
    return TS_OK;
}

ts_status ts_evaluate(ts_module *m, ts_batch_source *src, ts_eval_result *out) {
    return ts_evaluate_confusion(m, src, NULL, 0, out);
}

ts_status ts_evaluate_confusion(ts_module *m, ts_batch_source *src, int64_t *confusion, int64_t classes,
                                ts_eval_result *out) {
    TS_ARG(m && src && out, "ts_evaluate: NULL argument");
    TS_ARG(!confusion || classes >= 1, "ts_evaluate_confusion: %lld classes", (long long)classes);
    memset(out, 0, sizeof *out);
    if (confusion) memset(confusion, 0, sizeof *confusion * (size_t)(classes * classes));
    TS_TRY(ts_batch_source_seek(src, 0, 0));
    ts_module_train(m, false);
    bool prev = ts_grad_set_enabled(false);
    double loss_sum = 0.0;
    ts_status st = TS_OK;
    for (;;) {
        ts_batch b;
        ts_tensor *logits = NULL, *host = NULL;
        if ((st = ts_batch_source_next(src, &b)) != TS_OK || !b.x) break;
        int64_t per = b.size > 0 ? ts_tensor_numel(b.y) / b.size : 1; /* a sequence model's positions */
        st = ts_module_forward(m, b.x, &logits);
        if (st == TS_OK) st = sequence_rows(&logits, b.y);
        if (st == TS_OK && ts_tensor_ndim(logits) != 2)
            st = ts_error(TS_ERR_SHAPE, "evaluation: the model's output has %d dimensions; want (batch, classes), "
                          "or (batch, positions, classes) for labels (batch, positions)", ts_tensor_ndim(logits));
        if (st == TS_OK && ts_tensor_dtype(logits) != TS_F32) { /* bfloat16 under autocast: scored in float32 */
            ts_tensor *wide = NULL;
            st = ts_to_dtype(logits, TS_F32, &wide);
            ts_tensor_release(logits);
            logits = wide;
        }
        if (st == TS_OK) st = ts_to_device(logits, ts_device_cpu(), &host);
        if (st == TS_OK) st = score_rows(host, &b, per, out, &loss_sum, confusion, classes);
        ts_tensor_release(host);
        ts_tensor_release(logits);
        if (st != TS_OK) break;
        out->samples += b.real * per;
    }
    ts_grad_set_enabled(prev);
    if (st == TS_OK && out->samples == 0) /* not an accuracy of 0.00% */
        st = ts_error(TS_ERR_INVALID_ARG, "evaluation: the evaluation source has no samples");
    out->accuracy = out->samples ? (double)out->correct / (double)out->samples : NAN;
    out->top5_accuracy = out->samples ? (double)out->correct_top5 / (double)out->samples : NAN;
    out->loss = out->samples ? loss_sum / (double)out->samples : NAN;
    return st;
}

/* ---- optimizers and schedules by kind and by name ---------------------------------------------------- */
static const char *const optimizer_names[TS_OPTIMIZER_COUNT] = {"sgd", "adamw"};

const char *ts_optimizer_kind_name(ts_optimizer_kind k) {
    return (int)k >= 0 && k < TS_OPTIMIZER_COUNT ? optimizer_names[k] : NULL;
}

ts_status ts_optimizer_kind_from_name(const char *name, ts_optimizer_kind *out) {
    TS_ARG(out, "ts_optimizer_kind_from_name: NULL argument");
    for (int k = 0; name && k < TS_OPTIMIZER_COUNT; k++)
        if (strcasecmp(name, optimizer_names[k]) == 0) {
            *out = (ts_optimizer_kind)k;
            return TS_OK;
        }
    return ts_error(TS_ERR_INVALID_ARG, "unknown optimizer '%s' (expected sgd or adamw)", name ? name : "(null)");
}

ts_status ts_optimizer_by_kind(ts_optimizer_kind k, const ts_tensor_list *params, double lr, double momentum,
                               double weight_decay, ts_optimizer **out) {
    TS_ARG(params && out, "ts_optimizer_by_kind: NULL argument");
    if (k == TS_OPTIMIZER_SGD) {
        ts_sgd_config c = TS_SGD_CONFIG_INIT;
        c.lr = (float)lr;
        c.momentum = (float)momentum;
        c.weight_decay = (float)weight_decay;
        return ts_optim_sgd_new(params, &c, out);
    }
    if (k == TS_OPTIMIZER_ADAMW) {
        ts_adamw_config c = TS_ADAMW_CONFIG_INIT;
        c.lr = (float)lr;
        c.weight_decay = (float)weight_decay;
        return ts_optim_adamw_new(params, &c, out);
    }
    return ts_error(TS_ERR_INVALID_ARG, "ts_optimizer_by_kind: %d is not an optimizer kind", (int)k);
}

ts_status ts_optimizer_by_name(const char *name, const ts_tensor_list *params, double lr, double momentum,
                               double weight_decay, ts_optimizer **out) {
    ts_optimizer_kind k;
    TS_TRY(ts_optimizer_kind_from_name(name, &k));
    return ts_optimizer_by_kind(k, params, lr, momentum, weight_decay, out);
}

const char *ts_lr_kind_name(ts_lr_kind k) {
    return k == TS_LR_CONSTANT ? "none" : k == TS_LR_STEP ? "step" : k == TS_LR_COSINE ? "cosine" : NULL;
}

ts_status ts_lr_kind_from_name(const char *name, ts_lr_kind *out) {
    TS_ARG(out, "ts_lr_kind_from_name: NULL argument");
    for (int k = TS_LR_CONSTANT; name && k <= TS_LR_COSINE; k++)
        if (strcasecmp(name, ts_lr_kind_name((ts_lr_kind)k)) == 0) {
            *out = (ts_lr_kind)k;
            return TS_OK;
        }
    return ts_error(TS_ERR_INVALID_ARG, "unknown learning-rate schedule '%s' (expected none, step or cosine)",
                    name ? name : "(null)");
}

ts_status ts_lr_schedule_by_kind(ts_lr_kind k, double lr, int64_t total_steps, int64_t steps_per_epoch,
                                 ts_lr_schedule *out) {
    TS_ARG(out, "ts_lr_schedule_by_kind: NULL argument");
    if (k == TS_LR_CONSTANT)
        *out = ts_lr_constant(lr);
    else if (k == TS_LR_STEP)
        *out = ts_lr_step(lr, steps_per_epoch > 0 ? steps_per_epoch : 1, 0.1);
    else if (k == TS_LR_COSINE)
        *out = ts_lr_cosine(lr, total_steps > 0 ? total_steps : 1, 0.0);
    else
        return ts_error(TS_ERR_INVALID_ARG, "ts_lr_schedule_by_kind: %d is not a schedule kind", (int)k);
    return ts_lr_schedule_check(out);
}

ts_status ts_lr_schedule_by_name(const char *name, double lr, int64_t total_steps, int64_t steps_per_epoch,
                                 ts_lr_schedule *out) {
    ts_lr_kind k;
    TS_TRY(ts_lr_kind_from_name(name, &k));
    return ts_lr_schedule_by_kind(k, lr, total_steps, steps_per_epoch, out);
}
