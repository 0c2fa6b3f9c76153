/*
 * tests/pipeline_dump.c — the C pipeline's batches written to a file, for tests/python/test_pipeline.py to compare
 * tessera.data.ImagePipeline with (the same options set as a C program sets them, docs/pipeline.md).
 *
 *   pipeline_dump OUT ROOT BATCH SIZE SHARD SHARDS SEED THREADS EPOCHS TRAIN SHUFFLE LAST_BATCH COLOR
 *
 * TRAIN 1: random resized crop + flip 0.5; 0: the evaluation transform (center_crop 0.875); both with ImageNet's
 * mean and std in pixel units (gray: the red channel's). SHUFFLE, LAST_BATCH, COLOR: the library's names. OUT gets, per batch of EPOCHS
 * epochs, int64 {epoch, batch, rows}, the labels (rows int64) and the images (rows * C * H * W float32).
 */
#include <stdio.h>
#include <stdlib.h>
#include <tessera.h>

int main(int argc, char **argv) {
    if (argc != 14) {
        fprintf(stderr, "usage: pipeline_dump OUT ROOT BATCH SIZE SHARD SHARDS SEED THREADS EPOCHS TRAIN SHUFFLE "
                        "LAST_BATCH COLOR\n");
        return 2;
    }
    ts_pipeline_opts o = TS_PIPELINE_OPTS_INIT;
    ts_shuffle sh;
    o.reader.file_root = argv[2];
    o.batch_size = atoll(argv[3]);
    o.out_width = o.out_height = atoi(argv[4]);
    o.reader.shard_id = atoi(argv[5]);
    o.reader.num_shards = atoi(argv[6]);
    o.reader.seed = o.reader.shuffle_after_epoch_seed = atoll(argv[7]);
    o.num_threads = atoi(argv[8]);
    int epochs = atoi(argv[9]), train = atoi(argv[10]);
    if (ts_shuffle_parse(argv[11], &sh) != TS_OK || ts_last_batch_parse(argv[12], &o.last_batch) != TS_OK ||
        ts_color_parse(argv[13], &o.color) != TS_OK) {
        fprintf(stderr, "pipeline_dump: %s\n", ts_last_error());
        return 2;
    }
    ts_reader_opts_set_shuffle(&o.reader, sh);
    o.random_resized_crop = train;
    o.flip_prob = train ? 0.5f : 0.0f;
    o.center_crop = train ? 0.0f : 0.875f;
    const float mean[3] = {0.485f * 255, 0.456f * 255, 0.406f * 255}, std[3] = {0.229f * 255, 0.224f * 255, 0.225f * 255};
    for (int c = 0; c < 3; c++) { /* gray: the red channel's */
        o.mean[c] = mean[o.color == TS_COLOR_GRAY ? 0 : c];
        o.std[c] = std[o.color == TS_COLOR_GRAY ? 0 : c];
    }
    ts_pipeline *p = NULL;
    FILE *f = fopen(argv[1], "wb");
    if (!f || ts_pipeline_new(&o, &p) != TS_OK) {
        fprintf(stderr, "pipeline_dump: %s\n", f ? ts_last_error() : argv[1]);
        return 1;
    }
    for (int e = 0; e < epochs;) {
        ts_tensor *x, *y;
        ts_batch_info bi;
        if (ts_pipeline_next(p, &x, &y, &bi) != TS_OK) {
            fprintf(stderr, "pipeline_dump: %s\n", ts_last_error());
            return 1;
        }
        if (!x) {
            e++;
            continue;
        }
        int64_t head[3] = {bi.epoch, bi.batch, bi.size};
        fwrite(head, sizeof head, 1, f);
        fwrite(ts_tensor_data(y), ts_tensor_nbytes(y), 1, f);
        fwrite(ts_tensor_data(x), ts_tensor_nbytes(x), 1, f);
    }
    ts_pipeline_free(p);
    return fclose(f) != 0;
}
