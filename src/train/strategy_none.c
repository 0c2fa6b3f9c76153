/*
 * train/strategy_none.c — no strategy: the model runs where it was built
 * (the CPU), forward + cross-entropy + backward as usual.
 */
#include "train/strategy.h"

#include <stdio.h>

static ts_status none_wrap(ts_strategy *s, ts_module *model, const ts_strategy_opts *o) {
    (void)o;
    s->runner = s->model = model;
    snprintf(s->desc, sizeof s->desc, "none: the model on the CPU");
    return TS_OK;
}

const ts__strategy_impl ts__strategy_none = {
    TS_STRATEGY_NONE, "none", "the model on the CPU (one process, one device)", false, none_wrap, NULL, NULL,
};
