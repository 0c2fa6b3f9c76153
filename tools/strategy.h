/*
 * tools/strategy.h — single-process multi-device strategies for
 * `tessera train --strategy NAME --devices LIST`.
 *
 * A strategy wraps the model (built on "cpu") into a runner module for the
 * given devices. The runner's forward takes a CPU batch and returns CPU logits;
 * its parameters are the model's own tensors (moved to their devices), so the
 * optimizer, train_step and evaluate work on it unchanged. A strategy that
 * must schedule the loss itself (the pipeline's 1F1B) also provides
 * forward_backward. Each strategy lives in tools/strategy_<name>.c; the table
 * is in tools/strategy.c.
 */
#ifndef TS_TOOLS_STRATEGY_H
#define TS_TOOLS_STRATEGY_H

#include "tessera.h"

typedef struct strategy_config {
    int micro_batches;    /* pipeline: micro-batches per batch (default 8) */
    const char *schedule; /* pipeline: "gpipe" or "1f1b" (default "1f1b") */
} strategy_config;

typedef struct train_strategy {
    const char *name; /* "data", "model", "pipeline", "tile" */
    const char *help; /* one line for --help */
    /* Takes ownership of model (freed on failure too); *runner's child "module" is the model. */
    ts_status (*wrap)(ts_module *model, ts_device *const *devs, int ndev, const strategy_config *cfg,
                      ts_module **runner);
    /* Optional: forward, mean cross-entropy over the whole batch and backward on x, y (CPU);
     * gradients end in the model's parameters. NULL: the usual forward + loss + backward. */
    ts_status (*forward_backward)(ts_module *runner, const ts_tensor *x, const ts_tensor *y, float label_smoothing,
                                  float *loss);
} train_strategy;

/* The strategy called name, or NULL (strategy.c). */
const train_strategy *strategy_find(const char *name);
/* "data, model, pipeline, tile" (static). */
const char *strategy_names(void);

#endif
