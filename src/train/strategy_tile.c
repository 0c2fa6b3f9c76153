/*
 * train/strategy_tile.c — tile (spatial) parallelism (ts_nn_tile_parallel_new):
 * each image is cut into horizontal bands, one per device; the convolutional
 * layers run on the bands concurrently with halo exchange, so training computes
 * exactly what one device computes. The head (Flatten and the Linear layers)
 * runs on the CPU after the bands are gathered, and the parameters stay on the
 * CPU. A 2x2 pooling halves the rows, so with many devices some bands run out
 * of rows deeper in the net and those devices sit out the rest of the stack.
 */
#include "train/strategy.h"

#include <stdio.h>

static ts_status tile_wrap(ts_strategy *s, ts_module *model, const ts_strategy_opts *o) {
    (void)o;
    TS_TRY(ts_nn_tile_parallel_new(model, s->devs, s->ndev, ts_device_cpu(), &s->runner));
    s->model = ts_module_child(s->runner, "module");
    snprintf(s->desc, sizeof s->desc, "tile: each image split into %d bands of rows", s->ndev);
    ts__strategy_describe_devices(s);
    return TS_OK;
}

const ts__strategy_impl ts__strategy_tile = {
    TS_STRATEGY_TILE, "tile",
    "cut each image into bands of rows, one per device, with halo exchange (same result as one device)",
    true, tile_wrap, NULL, NULL,
};
