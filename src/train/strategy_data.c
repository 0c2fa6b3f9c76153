/*
 * train/strategy_data.c — DataParallel (tessera/parallel.h): the model moves
 * to the first device; every batch is split over the devices (torch.chunk's
 * rule), the replicas run forward and backward at the same time, each on its
 * device's worker thread, and their parameter gradients are summed into the
 * model's, so one step computes what one device computes on the whole batch
 * (BatchNorm normalises each device's share with its own statistics, as
 * PyTorch's DataParallel). The logits come back to the CPU for the loss.
 */
#include "train/strategy.h"

#include <stdio.h>

static ts_status data_wrap(ts_strategy *s, ts_module *model, const ts_strategy_opts *o) {
    (void)o;
    TS_TRY(ts_nn_data_parallel_new(model, s->devs, s->ndev, ts_device_cpu(), &s->runner));
    s->model = ts_module_child(s->runner, "module");
    snprintf(s->desc, sizeof s->desc, "data: the model on %s, each batch split", ts_device_name(s->devs[0]));
    ts__strategy_describe_devices(s);
    return TS_OK;
}

const ts__strategy_impl ts__strategy_data = {
    TS_STRATEGY_DATA, "data",
    "replicate the model on every device and split each batch between them (PyTorch's DataParallel)",
    true, data_wrap, NULL, NULL,
};
