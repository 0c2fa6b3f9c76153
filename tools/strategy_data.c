/*
 * tools/strategy_data.c — `tessera train --strategy data`: DataParallel
 * (include/tessera/parallel.h). The model moves to the first device; every
 * batch is split over the devices (torch.chunk's rule), the replicas run
 * forward and backward at the same time, each on its device's worker thread,
 * and their parameter gradients are summed into the model's, so one step
 * computes what one device computes on the whole batch (BatchNorm normalises
 * each device's share with its own statistics, as PyTorch's DataParallel).
 * The logits come back to the CPU, where the loss is computed; backward is the
 * usual one (no forward_backward).
 */
#include "strategy.h"

static ts_status data_wrap(ts_module *model, ts_device *const *devs, int ndev, const strategy_config *cfg,
                           ts_module **runner) {
    (void)cfg;
    ts_status st = ts_nn_data_parallel_new(model, devs, ndev, ts_device_cpu(), runner);
    if (st != TS_OK) return st;
    ts_log(TS_LOG_INFO, "data: the model on %s, each batch split over %d devices", ts_device_name(devs[0]), ndev);
    return TS_OK;
}

const train_strategy strategy_data = {
    "data",
    "replicate the model on every device and split each batch between them (PyTorch's DataParallel)",
    data_wrap,
    NULL,
};
