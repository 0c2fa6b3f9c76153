/*
 * train/strategy_model.c — model parallelism in depth (ts_nn_model_parallel_new):
 * the model's Sequential is cut into one stage per device, balanced by
 * parameter count unless bounds are given (the reference CNN over two devices:
 * the convolutional part on the first, Flatten's successors — the Linear
 * layers, 95% of the parameters — on the second); activations cross at the
 * boundaries and the logits come back to the CPU. Each step computes exactly
 * what one device computes; one device works at a time.
 */
#include "train/strategy.h"

#include <stdio.h>

static ts_status model_wrap(ts_strategy *s, ts_module *model, const ts_strategy_opts *o) {
    TS_TRY(ts_nn_model_parallel_new(model, s->devs, s->ndev, o->bounds, ts_device_cpu(), &s->runner));
    s->model = ts_module_child(s->runner, "module");
    int bounds[TS_STRATEGY_MAX_DEVICES];
    int n = ts_model_parallel_bounds(s->runner, bounds, TS_STRATEGY_MAX_DEVICES);
    size_t len = (size_t)snprintf(s->desc, sizeof s->desc, "model:");
    for (int i = 0; i < n && i < TS_STRATEGY_MAX_DEVICES && len < sizeof s->desc; i++)
        len += (size_t)snprintf(s->desc + len, sizeof s->desc - len, "%s %s: layers %d-%d", i ? "," : "",
                                ts_device_name(s->devs[i]), i ? bounds[i - 1] : 0, bounds[i] - 1);
    return TS_OK;
}

const ts__strategy_impl ts__strategy_model = {
    TS_STRATEGY_MODEL, "model",
    "cut the model's layers into one stage per device, balanced by parameter count (model parallelism)",
    true, model_wrap, NULL, NULL,
};
