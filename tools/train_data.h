/*
 * tools/train_data.h — `tessera train --data` on image folders and file lists:
 * the DALI-style pipeline (include/tessera/pipeline.h) as the training input,
 * one shard per DDP rank.
 */
#ifndef TS_TOOLS_TRAIN_DATA_H
#define TS_TOOLS_TRAIN_DATA_H

#include "tessera.h"

/* True when --data names images rather than IDX files: a file (a "path label"
 * list), or a folder with sub-folders and without train-images-idx3-ubyte[.gz]. */
bool train_data_is_images(const char *path);

/* The training pipeline over path (or path/train when it has train/ and test/,
 * the layout `tessera data export` writes): gray 28x28 images (the reference
 * models' input), normalised as Fashion-MNIST, DALI's shuffling buffer, shard
 * `rank` of `world` with pad_last_batch when world > 1 (every rank runs the same
 * number of steps). *test (only when want_test) is path/test decoded into
 * memory, or the training images when there is no test/ folder. */
ts_status train_images_open(const char *path, int64_t batch_size, int64_t seed, int threads, int rank, int world,
                            bool want_test, ts_pipeline **pipe, ts_dataset **test);

/* Index of the next batch, from the loader or the pipeline. */
int64_t train_batch_index(const ts_loader *loader, const ts_pipeline *pipe);

#endif
