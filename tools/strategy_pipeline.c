/*
 * tools/strategy_pipeline.c — `tessera train --strategy pipeline`: the model's
 * Sequential cut into one stage per device (GPipe or 1F1B over
 * --micro-batches micro-batches; include/tessera/parallel.h).
 *
 * The split is balanced by measured time (ts_pp_split_by_time on a
 * random micro-batch of 1x28x28 images, timed with one stage's thread budget),
 * so the stages take about equally long where the layers allow it. The runner's
 * forward returns CPU logits (evaluation); training goes through
 * ts_pp_train_step, which runs the schedule, the loss and the backward.
 */
#include "strategy.h"

#include <stdio.h>

#define PIPELINE_PROFILE_BATCH 8 /* a micro-batch of the default batch 64 cut in 8 */

static ts_status pipeline_wrap(ts_module *model, ts_device *const *devs, int ndev, const strategy_config *cfg,
                               ts_module **runner) {
    ts_pp_schedule sched = TS_PP_1F1B;
    ts_status st = TS_OK;
    int micro = cfg && cfg->micro_batches > 0 ? cfg->micro_batches : 8;
    if (cfg && cfg->schedule && (st = ts_pp_schedule_parse(cfg->schedule, &sched)) != TS_OK) {
        ts_module_free(model);
        return st;
    }
    int bounds[TS_PP_MAX_STAGES];
    const int *split = NULL;
    if (ndev >= 1 && ndev <= TS_PP_MAX_STAGES && ndev <= ts_nn_sequential_len(model)) {
        /* time the layers on one stage's thread budget; fall back to equal layer counts */
        ts_rng r;
        ts_rng_seed(&r, 1);
        int64_t shape[4] = {PIPELINE_PROFILE_BATCH, 1, 28, 28};
        ts_tensor *sample = NULL;
        int threads = ts_get_num_threads();
        ts_set_num_threads(ts_cpu_device_threads());
        if (ts_tensor_empty(ts_device_cpu(), TS_F32, 4, shape, &sample) == TS_OK &&
            ts_tensor_uniform_(sample, -1.0f, 1.0f, &r) == TS_OK &&
            ts_pp_split_by_time(model, sample, ndev, bounds) == TS_OK)
            split = bounds;
        else
            ts_log(TS_LOG_WARN, "pipeline: timing the layers failed (%s); splitting by layer count", ts_last_error());
        ts_set_num_threads(threads);
        ts_tensor_release(sample);
    }
    st = ts_nn_pipeline_parallel_new(model, devs, ndev, split, micro, sched, ts_device_cpu(), runner);
    if (st != TS_OK) return st;
    ts_pp_stats s;
    if (ts_pp_get_stats(*runner, &s) == TS_OK) {
        char buf[256];
        size_t len = 0;
        for (int i = 0; i < ndev && len < sizeof buf; i++)
            len += (size_t)snprintf(buf + len, sizeof buf - len, "%s%s: %d layers", i ? ", " : "",
                                    ts_device_name(devs[i]), s.layers[i]);
        ts_log(TS_LOG_INFO, "pipeline: %s schedule, %d micro-batches per batch; %s", ts_pp_schedule_name(sched),
               micro, buf);
    }
    return TS_OK;
}

static ts_status pipeline_forward_backward(ts_module *runner, const ts_tensor *x, const ts_tensor *y,
                                           float label_smoothing, float *loss) {
    return ts_pp_train_step(runner, x, y, label_smoothing, loss);
}

const train_strategy strategy_pipeline = {
    "pipeline",
    "the model's layers cut into one stage per device; micro-batches flow through them (--micro-batches, "
    "--schedule gpipe|1f1b)",
    pipeline_wrap,
    pipeline_forward_backward,
};
