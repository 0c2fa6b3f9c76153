/*
 * tools/strategy_tile.c — `tessera train --strategy tile`: tile (spatial)
 * parallelism. Each image is cut into horizontal bands, one per device; the
 * model's convolutional layers run on the bands concurrently with halo
 * exchange, so training computes exactly what one device computes
 * (ts_nn_tile_parallel_new, include/tessera/parallel.h). The head (Flatten and
 * the Linear layers) runs on the CPU after the bands are gathered, and the
 * model's parameters stay on the CPU: the optimizer, train_step and evaluate
 * use the runner as a plain model. Backward is the usual one (no
 * forward_backward).
 *
 * The reference CNN (28 rows) takes up to 28 devices; its 2x2 poolings halve
 * the rows, so with many devices some bands run out of rows after a pooling
 * layer and those devices sit out the rest of the stack. The MLP has no
 * convolutional layers: its bands are only gathered again.
 */
#include "strategy.h"

static ts_status tile_wrap(ts_module *model, ts_device *const *devs, int ndev, const strategy_config *cfg,
                           ts_module **runner) {
    (void)cfg;
    ts_status st = ts_nn_tile_parallel_new(model, devs, ndev, ts_device_cpu(), runner);
    if (st == TS_OK) ts_log(TS_LOG_INFO, "tile: each image split into %d bands of rows", ndev);
    return st;
}

const train_strategy strategy_tile = {
    "tile",
    "cut each image into bands of rows, one per device, with halo exchange (same result as one device)",
    tile_wrap,
    NULL,
};
