/*
 * train/strategy_none.c — no strategy: one process, one device. The model runs
 * on the CPU where it was built, or on opts->devices[0] (a CUDA device, say):
 * then the model moves there once and the runner is Sequential(ToDevice(dev),
 * model), so batches from any source (host memory) are copied over in forward,
 * and forward_backward copies the labels too. Evaluation runs the runner, whose
 * logits the scorer copies back.
 */
#include "train/strategy.h"
#include "core/timeline.h"

#include <stdio.h>

static ts_status none_wrap(ts_strategy *s, ts_module *model, const ts_strategy_opts *o) {
    s->runner = s->model = model;
    ts_device *dev = NULL;
    TS_TRY(ts__strategy_one_device(s, o, &dev));
    snprintf(s->desc, sizeof s->desc, "none: the model on %s", dev == ts_device_cpu() ? "the CPU" : ts_device_name(dev));
    return ts__strategy_place(s, model, dev);
}

/* x and y to the model's device, then forward + cross-entropy + backward. */
static ts_status none_forward_backward(ts_strategy *s, const ts_tensor *x, const ts_tensor *y, float label_smoothing,
                                       float *loss) {
    ts_device *dev = s->devs[0];
    ts_tensor *xd = NULL, *yd = NULL, *logits = NULL, *lt = NULL;
    double t0 = ts__tl_now(); /* the timeline's forward and backward (core/timeline.h) */
    ts_status st = ts__strategy_batch_to(dev, x, y, &xd, &yd);
    if (st == TS_OK) st = ts_module_forward(s->model, xd, &logits);
    if (st == TS_OK) st = ts__cross_entropy_seq(logits, yd, label_smoothing, &lt);
    ts__tl_span(TS__TL_TRAINER, "forward", t0);
    t0 = ts__tl_now();
    if (st == TS_OK) st = ts__strategy_backward(s, lt);
    if (st == TS_OK) st = ts__strategy_read_loss(lt, loss);
    ts__tl_span(TS__TL_TRAINER, "backward", t0);
    ts_tensor_release(lt);
    ts_tensor_release(logits);
    ts_tensor_release(yd);
    ts_tensor_release(xd);
    return st;
}

const ts__strategy_impl ts__strategy_none = {
    TS_STRATEGY_NONE, "none", "the model on one device, the CPU unless --device names another (one process)", false,
    none_wrap, none_forward_backward, NULL,
};
