/*
 * tools/train_common.c — one training step and an evaluation pass.
 */
#include "train_common.h"

ts_status train_step(ts_module *model, ts_ddp *ddp, ts_optimizer *opt, ts_tensor *x, ts_tensor *y,
                     float label_smoothing, float *loss) {
    ts_tensor *logits = NULL, *l = NULL;
    ts_status st = ddp ? ts_ddp_forward(ddp, x, &logits) : ts_module_forward(model, x, &logits);
    if (st == TS_OK) st = ts_cross_entropy(logits, y, label_smoothing, &l);
    if (st == TS_OK) *loss = (float)ts_tensor_item(l, 0);
    if (st == TS_OK) st = ts_backward(l, NULL, false);
    if (st == TS_OK && ddp) st = ts_ddp_sync_status(ddp); /* the all-reduces finished inside backward */
    if (st == TS_OK) st = ts_optimizer_step(opt);
    ts_optimizer_zero_grad(opt);
    ts_tensor_release(l);
    ts_tensor_release(logits);
    return st;
}

ts_status train_step_strategy(ts_module *runner, const train_strategy *s, ts_optimizer *opt, ts_tensor *x,
                              ts_tensor *y, float label_smoothing, float *loss) {
    if (!s || !s->forward_backward) return train_step(runner, NULL, opt, x, y, label_smoothing, loss);
    ts_status st = s->forward_backward(runner, x, y, label_smoothing, loss);
    if (st == TS_OK) st = ts_optimizer_step(opt);
    ts_optimizer_zero_grad(opt);
    return st;
}

ts_status evaluate(ts_module *model, ts_dataset *ds, int64_t batch_size, double *accuracy) {
    ts_loader_opts o = TS_LOADER_OPTS_INIT;
    o.batch_size = batch_size;
    o.shuffle = false;
    ts_loader *ld = NULL;
    ts_status st = ts_loader_new(ds, &o, &ld);
    if (st != TS_OK) return st;
    ts_module_train(model, false);
    bool prev = ts_grad_set_enabled(false);
    int64_t correct = 0, total = 0;
    for (;;) {
        ts_tensor *x = NULL, *y = NULL, *logits = NULL;
        if ((st = ts_loader_next(ld, &x, &y)) != TS_OK || !x) break;
        if ((st = ts_module_forward(model, x, &logits)) != TS_OK) break;
        const float *p = ts_tensor_data_f32(logits);
        const int64_t *lab = ts_tensor_data(y);
        int64_t n = ts_tensor_dim(logits, 0), c = ts_tensor_dim(logits, 1);
        for (int64_t i = 0; i < n; i++) {
            int64_t best = 0;
            for (int64_t k = 1; k < c; k++)
                if (p[i * c + k] > p[i * c + best]) best = k;
            correct += best == lab[i];
        }
        total += n;
        ts_tensor_release(logits);
    }
    ts_grad_set_enabled(prev);
    ts_loader_free(ld);
    *accuracy = total ? (double)correct / (double)total : 0.0;
    return st;
}
