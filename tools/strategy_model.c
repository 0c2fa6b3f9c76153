/*
 * tools/strategy_model.c — `tessera train --strategy model`: model
 * parallelism in depth (ts_nn_model_parallel_new, include/tessera/parallel.h).
 * The model's Sequential is cut into one stage per device, balanced by
 * parameter count (the reference CNN over two devices: the convolutional part
 * on the first, Flatten's successors — the Linear layers, 95% of the
 * parameters — on the second); activations cross at the boundaries and the
 * logits come back to the CPU. Each step computes exactly what one device
 * computes; one device works at a time (the pipeline strategy overlaps them).
 */
#include "strategy.h"

#include <stdio.h>

#define MODEL_MAX_STAGES 64

static ts_status model_wrap(ts_module *model, ts_device *const *devs, int ndev, const strategy_config *cfg,
                            ts_module **runner) {
    (void)cfg;
    ts_status st = ts_nn_model_parallel_new(model, devs, ndev, NULL, ts_device_cpu(), runner);
    if (st != TS_OK) return st;
    int bounds[MODEL_MAX_STAGES];
    int n = ts_model_parallel_bounds(*runner, bounds, MODEL_MAX_STAGES);
    char buf[512];
    size_t len = 0;
    for (int i = 0; i < n && i < MODEL_MAX_STAGES && len < sizeof buf; i++)
        len += (size_t)snprintf(buf + len, sizeof buf - len, "%s%s: layers %d-%d", i ? ", " : "",
                                ts_device_name(devs[i]), i ? bounds[i - 1] : 0, bounds[i] - 1);
    ts_log(TS_LOG_INFO, "model: %s", buf);
    return TS_OK;
}

const train_strategy strategy_model = {
    "model",
    "cut the model's layers into one stage per device, balanced by parameter count (model parallelism)",
    model_wrap,
    NULL,
};
