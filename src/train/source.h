/*
 * train/source.h — what train/data.c needs of train/source.c (internal).
 */
#ifndef TS_TRAIN_SOURCE_H
#define TS_TRAIN_SOURCE_H

#include "tessera/train.h"

/* ts_batch_source_dataset, owning ds when `own` (ds is then freed with the source, also when this fails). */
ts_status ts__batch_source_dataset(ts_dataset *ds, bool own, const ts_dataset_source_opts *o,
                                   ts_batch_source **out);

#endif
