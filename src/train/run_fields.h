/*
 * train/run_fields.h — inside the library: ts_run_config_check's use of the field table (run_fields.c).
 */
#ifndef TS_TRAIN_RUN_FIELDS_H
#define TS_TRAIN_RUN_FIELDS_H

#include "tessera/run.h"

/* Every number of c in its field's range and every enum one of its allowed values (TS_ERR_INVALID_ARG naming
 * the field). */
ts_status ts__run_config_check_fields(const ts_run_config *c);

#endif
