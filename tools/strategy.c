/*
 * tools/strategy.c — the table of `tessera train --strategy` strategies
 * (tools/strategy.h). Each strategy lives in tools/strategy_<name>.c and
 * defines one `const train_strategy strategy_<name>`.
 */
#include "strategy.h"

#include <stdio.h>
#include <string.h>

extern const train_strategy strategy_data, strategy_model;
extern const train_strategy strategy_tile;
extern const train_strategy strategy_pipeline;
/* A new strategy: one extern line above and one entry in the table below. */

static const train_strategy *const strategies[] = {
    &strategy_data,
    &strategy_model,
    &strategy_pipeline,
    &strategy_tile,
    /* new strategies here */
};

#define NSTRATEGIES ((int)(sizeof strategies / sizeof strategies[0]))

const train_strategy *strategy_find(const char *name) {
    if (!name) return NULL;
    for (int i = 0; i < NSTRATEGIES; i++)
        if (strcmp(strategies[i]->name, name) == 0) return strategies[i];
    return NULL;
}

const char *strategy_names(void) {
    static char names[256];
    if (!names[0]) { /* the table is constant: build the list once */
        size_t len = 0;
        for (int i = 0; i < NSTRATEGIES && len < sizeof names; i++)
            len += (size_t)snprintf(names + len, sizeof names - len, "%s%s", i ? ", " : "", strategies[i]->name);
    }
    return names;
}
