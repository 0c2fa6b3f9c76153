/*
 * tests/pipeline_epoch.h — one epoch through an input pipeline, its batches copied to the host (from any
 * device): what the tests comparing two decodings of one folder share (tests/test_pipeline.c,
 * tests/test_cuda.c). Header-only; include test_util.h first.
 */
#ifndef TS_TEST_PIPELINE_EPOCH_H
#define TS_TEST_PIPELINE_EPOCH_H

/* The epoch 0 of a pipeline made from o: every batch's values appended to vals (room for an epoch's: the
 * caller's), its labels to labels and its rows' listing indices to idx; *skipped gets the samples left
 * out as corrupt. Checks that the batches are on o's device. Returns the rows. */
static int64_t tp_epoch(const ts_pipeline_opts *o, float *vals, int64_t *labels, int64_t *idx, int64_t *skipped) {
    ts_pipeline *p = NULL;
    CHECK_OK(ts_pipeline_new(o, &p));
    int64_t nv = 0, rows = 0;
    for (;;) {
        ts_tensor *x = NULL, *y = NULL;
        ts_batch_info bi;
        if (!p || ts_pipeline_next(p, &x, &y, &bi) != TS_OK || bi.epoch_end) break;
        CHECK(ts_tensor_device(x) == (o->device ? o->device : ts_device_cpu()));
        CHECK_OK(ts_tensor_to_host(x, vals + nv, ts_tensor_nbytes(x)));
        CHECK_OK(ts_tensor_to_host(y, labels + rows, ts_tensor_nbytes(y)));
        int64_t n = 0;
        const int64_t *si = ts_pipeline_batch_samples(p, &n);
        memcpy(idx + rows, si, sizeof(int64_t) * (size_t)n);
        nv += ts_tensor_numel(x);
        rows += bi.size;
    }
    int64_t dec = 0;
    *skipped = 0;
    if (p) ts_pipeline_counts(p, &dec, skipped);
    ts_pipeline_free(p);
    return rows;
}

#endif
