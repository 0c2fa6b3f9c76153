/*
 * train/strategy_pipeline.c — pipeline parallelism (ts_nn_pipeline_parallel_new):
 * the model's Sequential cut into one stage per device, each batch into
 * micro-batches flowing through them with the GPipe or 1F1B schedule.
 *
 * Without bounds the split is balanced by measured time: ts_pp_split_by_time
 * on a random micro-batch of the sample shape (8 samples: the default batch
 * 64 cut in 8), timed with one stage's thread budget, so the stages take about
 * equally long where the layers allow it; without a sample shape, equal layer
 * counts. A GPT (ts_model_gpt) is cut by block count instead (its blocks cost
 * the same; the embedding joins the first stage, ln_f and the tied head the
 * last: parallel/pipeline_parallel.c, nn/gpt_stages.c); its state dict, and so
 * the checkpoint, stays the one-device model's. Training goes through
 * ts_pp_train_step (schedule, loss, backward on the stage workers); the
 * module's forward returns CPU logits (evaluation).
 */
#include "train/strategy.h"

#include <stdio.h>

#define PIPELINE_PROFILE_BATCH 8

/* The split by measured time into bounds, or false (then equal layer counts). */
static bool split_by_time(ts_module *model, const ts_strategy_opts *o, int nstages, int *bounds) {
    if (ts_module_kind(model) != TS_MODULE_SEQUENTIAL || o->sample_ndim < 1 || o->sample_ndim > TS_MAX_DIMS - 1 ||
        nstages > ts_nn_sequential_len(model))
        return false;
    int64_t shape[TS_MAX_DIMS];
    shape[0] = PIPELINE_PROFILE_BATCH;
    for (int i = 0; i < o->sample_ndim; i++) shape[i + 1] = o->sample_shape[i];
    ts_rng r;
    ts_rng_seed(&r, 1);
    ts_tensor *sample = NULL;
    int threads = ts_get_num_threads();
    ts_set_num_threads(ts_cpu_device_threads());
    bool ok = ts_tensor_empty(ts_device_cpu(), TS_F32, o->sample_ndim + 1, shape, &sample) == TS_OK &&
              ts_tensor_uniform_(sample, -1.0f, 1.0f, &r) == TS_OK &&
              ts_pp_split_by_time(model, sample, nstages, bounds) == TS_OK;
    if (!ok) ts_log(TS_LOG_WARN, "pipeline: timing the layers failed (%s); splitting by layer count", ts_last_error());
    ts_set_num_threads(threads);
    ts_tensor_release(sample);
    return ok;
}

static ts_status pipeline_wrap(ts_strategy *s, ts_module *model, const ts_strategy_opts *o) {
    int bounds[TS_PP_MAX_STAGES];
    const int *split = o->bounds;
    if (!split && s->ndev <= TS_PP_MAX_STAGES && split_by_time(model, o, s->ndev, bounds)) split = bounds;
    TS_TRY(ts_nn_pipeline_parallel_new(model, s->devs, s->ndev, split, o->micro_batches, o->schedule,
                                       ts_device_cpu(), &s->runner));
    s->model = ts_module_child(s->runner, "module");
    const char *unit = ts_module_kind(s->model) == TS_MODULE_SEQUENTIAL ? "layers" : "blocks";
    ts_pp_stats st;
    size_t len = (size_t)snprintf(s->desc, sizeof s->desc, "pipeline: %s schedule, %d micro-batches per batch;",
                                  ts_pp_schedule_name(o->schedule), o->micro_batches);
    if (ts_pp_get_stats(s->runner, &st) == TS_OK)
        for (int i = 0; i < s->ndev && len < sizeof s->desc; i++)
            len += (size_t)snprintf(s->desc + len, sizeof s->desc - len, "%s %s: %d %s", i ? "," : "",
                                    ts_device_name(s->devs[i]), st.layers[i], unit);
    return TS_OK;
}

static ts_status pipeline_forward_backward(ts_strategy *s, const ts_tensor *x, const ts_tensor *y,
                                           float label_smoothing, float *loss) {
    return ts_pp_train_step(s->runner, x, y, label_smoothing, loss);
}

const ts__strategy_impl ts__strategy_pipeline = {
    TS_STRATEGY_PIPELINE,
    "pipeline",
    "the model's layers cut into one stage per device; micro-batches flow through them (GPipe or 1F1B)",
    true,
    pipeline_wrap,
    pipeline_forward_backward,
    NULL,
};
