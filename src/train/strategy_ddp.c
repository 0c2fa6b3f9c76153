/*
 * train/strategy_ddp.c — distributed data parallel: this process is one rank
 * of o->pg with a full replica of the model; ts_ddp (src/parallel/ddp.c)
 * averages the gradients over the ranks during backward, bucket by bucket. With
 * sync_bn, BatchNorm2d layers become SyncBatchNorm first (torch's
 * convert_sync_batchnorm before DDP). With a device (opts->devices[0]: a GPU
 * of this rank, a virtual CPU device) the model moves there first and each
 * batch is copied over; the buckets are all-reduced from host memory (DDP
 * copies gradients out and back), so any backend carries them. The module
 * that evaluates is the runner (ToDevice + the model): no communication.
 */
#include "train/strategy.h"
#include "core/timeline.h"

#include <stdio.h>

static ts_status ddp_wrap(ts_strategy *s, ts_module *model, const ts_strategy_opts *o) {
    s->runner = s->model = model; /* freed with the strategy from here on */
    if (!o->pg) return ts_error(TS_ERR_INVALID_ARG, "ddp: no process group (ts_strategy_opts.pg)");
    s->pg = o->pg;
    ts_device *dev = NULL;
    TS_TRY(ts__strategy_one_device(s, o, &dev));
    if (o->sync_bn) TS_TRY(ts_nn_convert_sync_batchnorm(model, o->pg));
    TS_TRY(ts__strategy_place(s, model, dev)); /* before ts_ddp_new, which hooks the parameters where they are */
    TS_TRY(ts_ddp_new(model, o->pg, o->ddp, &s->ddp));
    snprintf(s->desc, sizeof s->desc, "ddp: rank %d of %d (%s backend)%s%s%s", ts_pg_rank(o->pg), ts_pg_size(o->pg),
             ts_pg_backend_name(o->pg), o->sync_bn ? ", SyncBatchNorm" : "", dev == ts_device_cpu() ? "" : ", on ",
             dev == ts_device_cpu() ? "" : ts_device_name(dev));
    return TS_OK;
}

static ts_status ddp_forward_backward(ts_strategy *s, const ts_tensor *x, const ts_tensor *y, float label_smoothing,
                                      float *loss) {
    ts_tensor *logits = NULL, *l = NULL, *xd = NULL, *yd = NULL;
    double t0 = ts__tl_now(); /* the timeline's forward and backward (core/timeline.h) */
    ts_status st = ts__strategy_batch_to(s->devs[0], x, y, &xd, &yd); /* the rank's device */
    if (st == TS_OK) st = ts_ddp_forward(s->ddp, xd, &logits);
    if (st == TS_OK) st = ts__cross_entropy_seq(logits, yd, label_smoothing, &l);
    ts__tl_span(TS__TL_TRAINER, "forward", t0);
    t0 = ts__tl_now();
    if (st == TS_OK) st = ts__strategy_backward(s, l);
    if (st == TS_OK) st = ts_ddp_sync_status(s->ddp); /* the all-reduces finished inside backward */
    if (st == TS_OK) st = ts__strategy_read_loss(l, loss);
    ts__tl_span(TS__TL_TRAINER, "backward", t0);
    ts_tensor_release(l);
    ts_tensor_release(logits);
    ts_tensor_release(xd);
    ts_tensor_release(yd);
    return st;
}

static void ddp_destroy(ts_strategy *s) {
    ts_ddp_free(s->ddp);
    s->ddp = NULL;
}

const ts__strategy_impl ts__strategy_ddp = {
    TS_STRATEGY_DDP,
    "ddp",
    "one rank of a process group; gradients averaged over the ranks during backward (DistributedDataParallel)",
    false,
    ddp_wrap,
    ddp_forward_backward,
    ddp_destroy,
};
