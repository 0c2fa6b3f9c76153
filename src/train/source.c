/*
 * train/source.c — batch sources (tessera/train.h): the generic handle that
 * keeps the position, and the two implementations every input goes through:
 *
 *   dataset source:  ts_dataset + ts_dist_sampler (torch's DistributedSampler
 *                    order for (rank, world); a single process is the world of
 *                    one) + ts_loader fed the rank's index list each epoch.
 *   pipeline source: a ts_pipeline (its reader shards the data); the pipeline
 *                    streams from epoch to epoch, so a seek happens only when
 *                    the source is asked for a batch the pipeline is not at.
 *
 * The handle tracks (epoch, next batch index) itself, so every implementation
 * reports the same position after the same calls.
 */
#include "core/internal.h"
#include "train/source.h"

#include <stdio.h>

struct ts_batch_source {
    const ts_batch_source_ops *ops;
    void *impl;
    int64_t epoch, batch; /* the batch the next call returns */
    int64_t skipped;      /* samples left out as corrupt in the batches returned */
};

ts_status ts_batch_source_new(const ts_batch_source_ops *ops, void *impl, ts_batch_source **out) {
    ts_status st = TS_OK;
    if (!ops || !out || !ops->num_batches || !ops->num_samples || !ops->seek || !ops->next)
        st = ts_error(TS_ERR_INVALID_ARG, "ts_batch_source_new: NULL argument or a required op missing "
                                          "(num_batches, num_samples, seek, next)");
    ts_batch_source *s = st == TS_OK ? ts__calloc(1, sizeof *s) : NULL;
    if (st == TS_OK && !s) st = TS_ERR_NOMEM;
    if (st != TS_OK) {
        if (ops && ops->destroy && impl) ops->destroy(impl);
        if (out) *out = NULL;
        return st;
    }
    s->ops = ops;
    s->impl = impl;
    *out = s;
    return TS_OK;
}

void ts_batch_source_free(ts_batch_source *s) {
    if (!s) return;
    if (s->ops->destroy) s->ops->destroy(s->impl);
    free(s);
}

int64_t ts_batch_source_num_batches(const ts_batch_source *s, int64_t epoch) {
    return s ? s->ops->num_batches(s->impl, epoch) : 0;
}

int64_t ts_batch_source_num_samples(const ts_batch_source *s) { return s ? s->ops->num_samples(s->impl) : 0; }

int64_t ts_batch_source_num_classes(const ts_batch_source *s) {
    return s && s->ops->num_classes ? s->ops->num_classes(s->impl) : 0;
}

const char *ts_batch_source_class_name(const ts_batch_source *s, int64_t label) {
    return s && s->ops->class_name ? s->ops->class_name(s->impl, label) : NULL;
}

int ts_batch_source_sample_shape(const ts_batch_source *s, int64_t *shape) {
    return s && shape && s->ops->sample_shape ? s->ops->sample_shape(s->impl, shape) : 0;
}

ts_status ts_batch_source_seek(ts_batch_source *s, int64_t epoch, int64_t batch) {
    TS_ARG(s, "ts_batch_source_seek: NULL source");
    TS_ARG(epoch >= 0 && batch >= 0, "ts_batch_source_seek: negative position (epoch %lld, batch %lld)",
           (long long)epoch, (long long)batch);
    int64_t nb = s->ops->num_batches(s->impl, epoch);
    TS_ARG(batch <= nb, "ts_batch_source_seek: batch %lld of epoch %lld is past its %lld batches", (long long)batch,
           (long long)epoch, (long long)nb);
    TS_TRY(s->ops->seek(s->impl, epoch, batch));
    s->epoch = epoch;
    s->batch = batch;
    return TS_OK;
}

ts_status ts_batch_source_set_epoch(ts_batch_source *s, int64_t epoch) { return ts_batch_source_seek(s, epoch, 0); }

ts_status ts_batch_source_next(ts_batch_source *s, ts_batch *out) {
    TS_ARG(s && out, "ts_batch_source_next: NULL argument");
    memset(out, 0, sizeof *out);
    ts_status st = s->ops->next(s->impl, out);
    if (st != TS_OK) return st;
    if (!out->x) { /* the epoch is over: stay at its end until a seek */
        memset(out, 0, sizeof *out);
        out->epoch = s->epoch;
        out->index = s->batch;
        return TS_OK;
    }
    out->epoch = s->epoch;
    out->index = s->batch++;
    s->skipped += out->skipped;
    return TS_OK;
}

int64_t ts_batch_source_skipped(const ts_batch_source *s) { return s ? s->skipped : 0; }

int64_t ts_batch_source_epoch(const ts_batch_source *s) { return s ? s->epoch : 0; }
int64_t ts_batch_source_batch_index(const ts_batch_source *s) { return s ? s->batch : 0; }

/* ---- dataset source ------------------------------------------------------------------------------ */
typedef struct ds_source {
    ts_dataset *ds;    /* borrowed, or owned when `own` */
    bool own;
    ts_dataset_source_opts o;
    ts_dist_sampler sampler;
    ts_loader *loader;
    int64_t *idx, len; /* this rank's indices of the current epoch */
    int64_t n;         /* samples in the dataset */
} ds_source;

static int64_t ds_num_batches(void *impl, int64_t epoch) {
    const ds_source *d = impl;
    (void)epoch;
    int64_t B = d->o.batch_size;
    return d->o.drop_last ? d->len / B : (d->len + B - 1) / B;
}

static int64_t ds_num_samples(void *impl) { return ((const ds_source *)impl)->n; }

static ts_status ds_seek(void *impl, int64_t epoch, int64_t batch) {
    ds_source *d = impl;
    ts_dist_sampler_set_epoch(&d->sampler, epoch);
    TS_TRY(ts_dist_sampler_indices(&d->sampler, d->idx));
    return ts_loader_set_indices(d->loader, d->idx, d->len, batch);
}

static ts_status ds_next(void *impl, ts_batch *out) {
    ds_source *d = impl;
    int64_t b = ts_loader_batch_index(d->loader);
    TS_TRY(ts_loader_next(d->loader, &out->x, &out->y));
    if (!out->x) return TS_OK;
    out->size = ts_tensor_dim(out->x, 0);
    out->samples = d->idx + b * d->o.batch_size;
    /* DistributedSampler pads the shuffled list to a multiple of R by repeating
     * its start: rank r's position j is global position j * R + r, a repeat from N on. */
    int64_t R = d->o.world_size, r = d->o.rank, first = b * d->o.batch_size;
    out->real = 0;
    for (int64_t i = 0; i < out->size; i++) out->real += (first + i) * R + r < d->n;
    return TS_OK;
}

static int ds_sample_shape(void *impl, int64_t *shape) {
    return ts_dataset_sample_shape(((const ds_source *)impl)->ds, shape);
}

static void ds_destroy(void *impl) {
    ds_source *d = impl;
    ts_loader_free(d->loader);
    if (d->own) ts_dataset_free(d->ds);
    free(d->idx);
    free(d);
}

static int64_t ds_num_classes(void *impl) { return ts_dataset_num_classes(((const ds_source *)impl)->ds); }
static const char *ds_class_name(void *impl, int64_t label) {
    return ts_dataset_class_name(((const ds_source *)impl)->ds, label);
}

static const ts_batch_source_ops ds_ops = {ds_num_batches, ds_num_samples, ds_seek,       ds_next,
                                           ds_sample_shape, ds_destroy,    ds_num_classes, ds_class_name};

ts_status ts__batch_source_dataset(ts_dataset *ds, bool own, const ts_dataset_source_opts *o,
                                   ts_batch_source **out) {
    ts_status st = TS_OK;
    ds_source *d = NULL;
    if (out) *out = NULL;
    if (!ds || !o || !out) {
        st = ts_error(TS_ERR_INVALID_ARG, "ts_batch_source_dataset: NULL argument");
        goto fail;
    }
    if (o->batch_size < 1) {
        st = ts_error(TS_ERR_INVALID_ARG, "ts_batch_source_dataset: batch size %lld must be >= 1",
                      (long long)o->batch_size);
        goto fail;
    }
    if (!(d = ts__calloc(1, sizeof *d))) {
        st = TS_ERR_NOMEM;
        goto fail;
    }
    d->ds = ds;
    d->own = own;
    d->o = *o;
    d->n = ts_dataset_size(ds);
    TS_CHECK_GOTO(ts_dist_sampler_init(&d->sampler, d->n, o->world_size, o->rank, o->shuffle, o->seed, o->drop_last));
    d->len = ts_dist_sampler_len(&d->sampler);
    if (!(d->idx = ts__malloc(sizeof *d->idx * (size_t)(d->len > 0 ? d->len : 1)))) {
        st = TS_ERR_NOMEM;
        goto fail;
    }
    ts_loader_opts lo = TS_LOADER_OPTS_INIT;
    lo.batch_size = o->batch_size;
    lo.shuffle = false; /* the order is the sampler's */
    lo.drop_last = o->drop_last;
    lo.device = o->device;
    TS_CHECK_GOTO(ts_loader_new(ds, &lo, &d->loader));
    TS_CHECK_GOTO(ds_seek(d, 0, 0));
    return ts_batch_source_new(&ds_ops, d, out);
fail:
    if (d) {
        d->own = false;
        ds_destroy(d);
    }
    if (own) ts_dataset_free(ds);
    return st;
}

ts_status ts_batch_source_dataset(ts_dataset *ds, const ts_dataset_source_opts *o, ts_batch_source **out) {
    return ts__batch_source_dataset(ds, false, o, out);
}

/* ---- pipeline source ------------------------------------------------------------------------------ */
static int64_t pl_num_batches(void *impl, int64_t epoch) { return ts_pipeline_num_batches(impl, epoch); }
static int64_t pl_num_samples(void *impl) { return ts_reader_size(ts_pipeline_reader(impl)); }

static ts_status pl_seek(void *impl, int64_t epoch, int64_t batch) {
    ts_pipeline *p = impl;
    if (ts_pipeline_epoch(p) == epoch && ts_pipeline_batch_index(p) == batch) return TS_OK;
    return ts_pipeline_seek(p, epoch, batch);
}

static ts_status pl_next(void *impl, ts_batch *out) {
    ts_pipeline *p = impl;
    ts_batch_info info;
    TS_TRY(ts_pipeline_next(p, &out->x, &out->y, &info));
    if (!out->x) return TS_OK;
    out->size = info.size;
    out->real = info.real;
    out->samples = ts_pipeline_batch_samples(p, NULL);
    out->skipped = info.skipped;
    return TS_OK;
}

static int pl_sample_shape(void *impl, int64_t *shape) { return ts_pipeline_sample_shape(impl, shape); }
static void pl_destroy(void *impl) { ts_pipeline_free(impl); }

static int64_t pl_num_classes(void *impl) { return ts_reader_num_classes(ts_pipeline_reader(impl)); }
static const char *pl_class_name(void *impl, int64_t label) {
    return ts_reader_class_name(ts_pipeline_reader(impl), label);
}

static const ts_batch_source_ops pl_ops = {pl_num_batches, pl_num_samples, pl_seek,        pl_next,
                                           pl_sample_shape, pl_destroy,    pl_num_classes, pl_class_name};

ts_status ts_batch_source_pipeline(ts_pipeline *p, ts_batch_source **out) {
    if (!p || !out) {
        ts_pipeline_free(p);
        return ts_error(TS_ERR_INVALID_ARG, "ts_batch_source_pipeline: NULL argument");
    }
    if (ts_pipeline_epoch(p) != 0 || ts_pipeline_batch_index(p) != 0) {
        ts_status st = ts_pipeline_seek(p, 0, 0);
        if (st != TS_OK) {
            ts_pipeline_free(p);
            return st;
        }
    }
    return ts_batch_source_new(&pl_ops, p, out);
}
