/*
 * data/dataset.c — the dataset table, the in-memory dataset, the MNIST loader
 * and the batch loader.
 *
 * Ownership: a ts_dataset owns its impl (ops->destroy); the in-memory impl holds
 * one reference to each of its x and y tensors. A ts_loader borrows its dataset
 * and owns its order array and batch tensors; ts_loader_set_indices copies the
 * caller's index list into that order array (grown as needed).
 */
#include "data/idx_internal.h"
#include "tensor/tensor.h"
#include "tessera/data.h"

#include <math.h>
#include <stdio.h>
#include <unistd.h>

struct ts_dataset {
    const ts_dataset_ops *ops;
    void *impl;
    int sample_ndim;
    int64_t sample_shape[TS_MAX_DIMS];
    int64_t sample_numel;
    int64_t num_classes;
    char **names;    /* num_classes class names (owned), or NULL */
    float mean, std; /* current normalisation (0, 1: none) */
};

ts_status ts_dataset_new(const ts_dataset_ops *ops, void *impl, int sample_ndim, const int64_t *sample_shape,
                         int64_t num_classes, ts_dataset **out) {
    ts_status st = TS_OK;
    if (!ops || !ops->size || !ops->get || !out || (sample_ndim > 0 && !sample_shape))
        st = ts_error(TS_ERR_INVALID_ARG, "ts_dataset_new: NULL argument or missing size/get");
    else if (sample_ndim < 0 || sample_ndim > TS_MAX_DIMS - 1)
        st = ts_error(TS_ERR_SHAPE, "ts_dataset_new: sample ndim %d is out of range [0, %d]", sample_ndim,
                      TS_MAX_DIMS - 1);
    for (int i = 0; st == TS_OK && i < sample_ndim; i++)
        if (sample_shape[i] < 1)
            st = ts_error(TS_ERR_SHAPE, "ts_dataset_new: sample size %lld in dim %d", (long long)sample_shape[i], i);
    ts_dataset *ds = st == TS_OK ? ts__calloc(1, sizeof *ds) : NULL;
    if (st == TS_OK && !ds) st = TS_ERR_NOMEM;
    if (st != TS_OK) {
        if (ops && ops->destroy && impl) ops->destroy(impl);
        return st;
    }
    ds->ops = ops;
    ds->impl = impl;
    ds->sample_ndim = sample_ndim;
    for (int i = 0; i < sample_ndim; i++) ds->sample_shape[i] = sample_shape[i];
    ds->sample_numel = ts__numel(sample_ndim, sample_shape);
    ds->num_classes = num_classes;
    ds->mean = 0.0f;
    ds->std = 1.0f;
    *out = ds;
    return TS_OK;
}

void ts_dataset_free(ts_dataset *ds) {
    if (!ds) return;
    if (ds->ops->destroy) ds->ops->destroy(ds->impl);
    ts__class_names_free(ds->names, ds->num_classes);
    free(ds);
}

int64_t ts_dataset_size(const ts_dataset *ds) { return ds ? ds->ops->size(ds->impl) : 0; }
int64_t ts_dataset_sample_numel(const ts_dataset *ds) { return ds->sample_numel; }
int64_t ts_dataset_num_classes(const ts_dataset *ds) { return ds->num_classes; }

const char *ts_dataset_class_name(const ts_dataset *ds, int64_t label) {
    return ds && ds->names && label >= 0 && label < ds->num_classes ? ds->names[label] : NULL;
}

ts_status ts_dataset_set_class_names(ts_dataset *ds, const char *const *names, int64_t n) {
    TS_ARG(ds && (names || n == 0) && n >= 0, "ts_dataset_set_class_names: NULL argument");
    if (n == 0) {
        ts__class_names_free(ds->names, ds->num_classes);
        ds->names = NULL;
        return TS_OK;
    }
    TS_ARG(n >= ds->num_classes, "ts_dataset_set_class_names: %lld names for %lld classes (labels 0..%lld)",
           (long long)n, (long long)ds->num_classes, (long long)ds->num_classes - 1);
    for (int64_t i = 0; i < n; i++)
        TS_ARG(names[i] && names[i][0] && !strchr(names[i], '\n'),
               "ts_dataset_set_class_names: name %lld is NULL, empty or holds a newline", (long long)i);
    char **v = ts__calloc((size_t)n, sizeof *v);
    if (!v) return TS_ERR_NOMEM;
    for (int64_t i = 0; i < n; i++)
        if (!(v[i] = ts__strdup(names[i]))) {
            ts__class_names_free(v, i);
            return TS_ERR_NOMEM;
        }
    ts__class_names_free(ds->names, ds->num_classes);
    ds->names = v;
    ds->num_classes = n;
    return TS_OK;
}

int ts_dataset_sample_shape(const ts_dataset *ds, int64_t *shape) {
    for (int i = 0; shape && i < ds->sample_ndim; i++) shape[i] = ds->sample_shape[i];
    return ds->sample_ndim;
}

ts_status ts_dataset_get(const ts_dataset *ds, int64_t i, float *x, int64_t *y) {
    TS_ARG(ds && x && y, "ts_dataset_get: NULL argument");
    int64_t n = ds->ops->size(ds->impl);
    TS_ARG(i >= 0 && i < n, "ts_dataset_get: index %lld is out of range [0, %lld)", (long long)i, (long long)n);
    return ds->ops->get(ds->impl, i, x, y);
}

ts_status ts_dataset_set_normalize(ts_dataset *ds, float mean, float std) {
    TS_ARG(ds, "ts_dataset_set_normalize: NULL dataset");
    TS_ARG(std > 0 && isfinite(std) && isfinite(mean), "ts_dataset_set_normalize: bad mean %g / std %g", mean, std);
    if (!ds->ops->set_normalize)
        return ts_error(TS_ERR_UNSUPPORTED, "ts_dataset_set_normalize: this dataset has no normalisation");
    TS_TRY(ds->ops->set_normalize(ds->impl, mean, std));
    ds->mean = mean;
    ds->std = std;
    return TS_OK;
}

void ts_dataset_get_normalize(const ts_dataset *ds, float *mean, float *std) {
    if (mean) *mean = ds->mean;
    if (std) *std = ds->std;
}

/* ---- in-memory dataset -------------------------------------------------------------------- */
typedef struct mem_impl {
    ts_tensor *x, *y; /* owned references; x (N, ...) float32, y (N) int64 */
    int64_t n, numel;
    float mean, std; /* the normalisation applied to x */
    bool from_u8;    /* raw values are k / 255: re-normalising rounds back to k exactly */
} mem_impl;

static int64_t mem_size(void *impl) { return ((mem_impl *)impl)->n; }

static ts_status mem_get(void *impl, int64_t i, float *x, int64_t *y) {
    mem_impl *m = impl;
    memcpy(x, ts__f32(m->x) + i * m->numel, sizeof(float) * (size_t)m->numel);
    *y = ((const int64_t *)ts__ptr(m->y))[i];
    return TS_OK;
}

/* x: (n, numel) gathered rows X[idx[k]]; y: (n) labels Y[idx[k]]. */
static ts_status mem_get_batch(void *impl, const int64_t *idx, int64_t n, float *x, int64_t *y) {
    mem_impl *m = impl;
    const float *X = ts__f32(m->x);
    const int64_t *Y = ts__ptr(m->y);
    size_t row = sizeof(float) * (size_t)m->numel;
    for (int64_t k = 0; k < n; k++) {
        int64_t i = idx[k];
        if (i < 0 || i >= m->n)
            return ts_error(TS_ERR_INVALID_ARG, "dataset: index %lld is out of range [0, %lld)", (long long)i,
                            (long long)m->n);
        memcpy(x + k * m->numel, X + i * m->numel, row);
        y[k] = Y[i];
    }
    return TS_OK;
}

static ts_status mem_set_normalize(void *impl, float mean, float std) {
    mem_impl *m = impl;
    float *x = ts__f32(m->x);
    int64_t total = m->n * m->numel;
    float om = m->mean, os = m->std;
    if (m->from_u8) {
        float lut[256];
        for (int k = 0; k < 256; k++) lut[k] = ((float)k / 255.0f - mean) / std;
#pragma omp parallel for schedule(static)
        for (int64_t j = 0; j < total; j++) {
            long k = lroundf((x[j] * os + om) * 255.0f);
            x[j] = lut[k < 0 ? 0 : k > 255 ? 255 : k];
        }
    } else {
#pragma omp parallel for schedule(static)
        for (int64_t j = 0; j < total; j++) x[j] = ((x[j] * os + om) - mean) / std;
    }
    m->mean = mean;
    m->std = std;
    return TS_OK;
}

static void mem_destroy(void *impl) {
    mem_impl *m = impl;
    ts_tensor_release(m->x);
    ts_tensor_release(m->y);
    free(m);
}

static const ts_dataset_ops mem_ops = {
    .size = mem_size,
    .get = mem_get,
    .get_batch = mem_get_batch,
    .set_normalize = mem_set_normalize,
    .destroy = mem_destroy,
};

ts_status ts_dataset_from_tensors(ts_tensor *x, ts_tensor *y, ts_dataset **out) {
    TS_ARG(x && y && out, "ts_dataset_from_tensors: NULL argument");
    char a[96], b[96];
    TS_TRY(ts__check_f32("ts_dataset_from_tensors", "x", x));
    if (y->dtype != TS_I64)
        return ts_error(TS_ERR_DTYPE, "ts_dataset_from_tensors: y has dtype %s, expected int64", ts_dtype_name(y->dtype));
    if (x->ndim < 1 || y->ndim != 1 || x->shape[0] != y->shape[0])
        return ts_error(TS_ERR_SHAPE, "ts_dataset_from_tensors: x %s and y %s (expected (N, ...) and (N))",
                        ts_shape_str(x->ndim, x->shape, a, sizeof a), ts_shape_str(y->ndim, y->shape, b, sizeof b));
    if (!x->storage->device->host_accessible || !y->storage->device->host_accessible)
        return ts_error(TS_ERR_DEVICE, "ts_dataset_from_tensors: x and y must be CPU tensors");
    if (!ts_tensor_is_contiguous(x) || !ts_tensor_is_contiguous(y))
        return ts_error(TS_ERR_UNSUPPORTED, "ts_dataset_from_tensors: x and y must be contiguous");
    mem_impl *m = ts__calloc(1, sizeof *m);
    if (!m) return TS_ERR_NOMEM;
    m->x = ts_tensor_retain(x);
    m->y = ts_tensor_retain(y);
    m->n = x->shape[0];
    m->numel = ts__numel(x->ndim - 1, x->shape + 1);
    m->mean = 0.0f;
    m->std = 1.0f;
    int64_t maxy = -1;
    const int64_t *Y = ts__ptr(y);
    for (int64_t i = 0; i < m->n; i++) maxy = TS_MAX(maxy, Y[i]);
    return ts_dataset_new(&mem_ops, m, x->ndim - 1, x->shape + 1, maxy + 1, out);
}

ts_status ts_dataset_tensors(const ts_dataset *ds, ts_tensor **x, ts_tensor **y) {
    TS_ARG(ds, "ts_dataset_tensors: NULL dataset");
    if (ds->ops != &mem_ops) return ts_error(TS_ERR_UNSUPPORTED, "ts_dataset_tensors: not an in-memory dataset");
    mem_impl *m = ds->impl;
    if (x) *x = m->x;
    if (y) *y = m->y;
    return TS_OK;
}

/* ---- MNIST / Fashion-MNIST ------------------------------------------------------------------- */
/* Picks the first existing name among "<dir>/<stem>.gz" and "<dir>/<stem>"; when
 * neither exists, the .gz name (so the error names the canonical file). */
static void mnist_path(const char *dir, const char *stem, char *buf, size_t n) {
    snprintf(buf, n, "%s/%s", dir, stem);
    size_t len = strlen(buf);
    if (access(buf, F_OK) == 0) {
        char gz[4096];
        snprintf(gz, sizeof gz, "%s.gz", buf);
        if (access(gz, F_OK) == 0 && len + 4 <= n) memcpy(buf + len, ".gz", 4);
        return;
    }
    if (len + 4 <= n) memcpy(buf + len, ".gz", 4);
}

ts_status ts_dataset_load_mnist(const char *dir, const char *split, ts_dataset **out) {
    TS_ARG(dir && split && out, "ts_dataset_load_mnist: NULL argument");
    const char *pre = strcmp(split, "train") == 0 ? "train" : strcmp(split, "test") == 0 ? "t10k" : NULL;
    TS_ARG(pre, "ts_dataset_load_mnist: split '%s' is not \"train\" or \"test\"", split);
    *out = NULL;
    char ipath[4096], lpath[4096], stem[64];
    snprintf(stem, sizeof stem, "%s-images-idx3-ubyte", pre);
    mnist_path(dir, stem, ipath, sizeof ipath);
    snprintf(stem, sizeof stem, "%s-labels-idx1-ubyte", pre);
    mnist_path(dir, stem, lpath, sizeof lpath);

    ts_status st = TS_OK;
    ts_tensor *img = NULL, *lab = NULL, *x = NULL, *y = NULL;
    char **names = NULL;
    int64_t nnames = 0;
    TS_CHECK_GOTO(ts_idx_read(ipath, 3, &img));
    TS_CHECK_GOTO(ts_idx_read(lpath, 1, &lab));
    int64_t n = img->shape[0], h = img->shape[1], w = img->shape[2];
    if (lab->shape[0] != n) {
        st = ts_error(TS_ERR_FORMAT, "count mismatch: %s has %lld images but %s has %lld labels", ipath, (long long)n,
                      lpath, (long long)lab->shape[0]);
        goto fail;
    }
    if (h < 1 || w < 1) {
        st = ts_error(TS_ERR_FORMAT, "%s: bad image size %lld x %lld", ipath, (long long)h, (long long)w);
        goto fail;
    }
    int64_t xs[4] = {n, 1, h, w};
    TS_CHECK_GOTO(ts__new(ts_device_cpu(), TS_F32, 4, xs, &x));
    TS_CHECK_GOTO(ts__new(ts_device_cpu(), TS_I64, 1, &n, &y));
    float lut[256];
    for (int k = 0; k < 256; k++) lut[k] = ((float)k / 255.0f - TS_FASHION_MNIST_MEAN) / TS_FASHION_MNIST_STD;
    const uint8_t *src = ts__ptr(img);
    float *dst = ts__f32(x);
    int64_t total = n * h * w;
#pragma omp parallel for schedule(static)
    for (int64_t j = 0; j < total; j++) dst[j] = lut[src[j]];
    const uint8_t *ls = ts__ptr(lab);
    int64_t *ld = ts__ptr(y);
    for (int64_t i = 0; i < n; i++) {
        if (ls[i] == 255) { /* no class: 255 marks missing labels in some IDX exports */
            st = ts_error(TS_ERR_FORMAT, "%s: sample %lld has label 255, which is not a class (labels must be below 255)",
                          lpath, (long long)i);
            goto fail;
        }
        ld[i] = ls[i];
    }
    int64_t maxl = -1;
    for (int64_t i = 0; i < n; i++) maxl = TS_MAX(maxl, ld[i]);
    TS_CHECK_GOTO(ts__idx_class_names(dir, img, lab, maxl, &names, &nnames));
    ts_dataset *ds = NULL;
    TS_CHECK_GOTO(ts_dataset_from_tensors(x, y, &ds));
    mem_impl *m = ds->impl;
    m->from_u8 = true;
    m->mean = ds->mean = TS_FASHION_MNIST_MEAN;
    m->std = ds->std = TS_FASHION_MNIST_STD;
    if (names && (st = ts_dataset_set_class_names(ds, (const char *const *)names, nnames)) != TS_OK) {
        ts_dataset_free(ds);
        goto fail;
    }
    *out = ds;
fail:
    ts__class_names_free(names, nnames);
    ts_tensor_release(img);
    ts_tensor_release(lab);
    ts_tensor_release(x);
    ts_tensor_release(y);
    return st;
}

/* ---- loader ------------------------------------------------------------------------------------- */
struct ts_loader {
    ts_dataset *ds; /* borrowed */
    ts_loader_opts o;
    int64_t n;             /* samples in the dataset */
    int64_t len, nb, tail; /* entries in this epoch's order, its batches, size of a short last batch (0: none) */
    int64_t epoch, next;
    int64_t *order; /* len entries in use of cap, owned */
    int64_t cap;
    ts_tensor *xb, *yb; /* full batch (B, ...) / (B), owned */
    ts_tensor *xt, *yt; /* views of the first `tail` rows, owned; NULL when tail == 0 */
    float *hx;          /* host staging for non-host devices, else NULL */
    int64_t *hy;
};

/* Batches over an order of len entries: sets len, nb and tail, and remakes the
 * views of the short last batch when its size changes (xt, yt are non-NULL
 * exactly when tail > 0). On failure nothing has changed. */
static ts_status loader_layout(ts_loader *ld, int64_t len) {
    int64_t B = ld->o.batch_size, tail = ld->o.drop_last ? 0 : len % B;
    if (tail != ld->tail) {
        ts_tensor *xt = NULL, *yt = NULL;
        if (tail) {
            int64_t shape[TS_MAX_DIMS];
            int sn = ts_dataset_sample_shape(ld->ds, shape + 1);
            shape[0] = tail;
            ts_status st = ts__view(ld->xb, sn + 1, shape, &xt);
            if (st == TS_OK) st = ts__view(ld->yb, 1, &tail, &yt);
            if (st != TS_OK) {
                ts_tensor_release(xt);
                return st;
            }
        }
        ts_tensor_release(ld->xt);
        ts_tensor_release(ld->yt);
        ld->xt = xt;
        ld->yt = yt;
    }
    ld->len = len;
    ld->nb = ld->o.drop_last ? len / B : (len + B - 1) / B;
    ld->tail = tail;
    return TS_OK;
}

void ts_loader_free(ts_loader *ld) {
    if (!ld) return;
    free(ld->order);
    ts_tensor_release(ld->xb);
    ts_tensor_release(ld->yb);
    ts_tensor_release(ld->xt);
    ts_tensor_release(ld->yt);
    free(ld->hx);
    free(ld->hy);
    free(ld);
}

ts_status ts_loader_new(ts_dataset *ds, const ts_loader_opts *opts, ts_loader **out) {
    TS_ARG(ds && opts && out, "ts_loader_new: NULL argument");
    TS_ARG(opts->batch_size >= 1, "ts_loader_new: batch size %lld must be >= 1", (long long)opts->batch_size);
    *out = NULL;
    ts_status st = TS_OK;
    ts_loader *ld = ts__calloc(1, sizeof *ld);
    if (!ld) return TS_ERR_NOMEM;
    ld->ds = ds;
    ld->o = *opts;
    if (!ld->o.device) ld->o.device = ts_device_cpu();
    ld->n = ts_dataset_size(ds);
    int64_t B = opts->batch_size;
    ld->cap = ld->n ? ld->n : 1;
    ld->order = ts__malloc(sizeof(int64_t) * (size_t)ld->cap);
    if (!ld->order) {
        st = TS_ERR_NOMEM;
        goto fail;
    }
    int64_t shape[TS_MAX_DIMS];
    shape[0] = B;
    int sn = ts_dataset_sample_shape(ds, shape + 1);
    TS_CHECK_GOTO(ts__new(ld->o.device, TS_F32, sn + 1, shape, &ld->xb));
    TS_CHECK_GOTO(ts__new(ld->o.device, TS_I64, 1, &B, &ld->yb));
    TS_CHECK_GOTO(loader_layout(ld, ld->n));
    if (!ld->o.device->host_accessible) {
        ld->hx = ts__malloc(sizeof(float) * (size_t)(B * ds->sample_numel));
        ld->hy = ts__malloc(sizeof(int64_t) * (size_t)B);
        if (!ld->hx || !ld->hy) {
            st = TS_ERR_NOMEM;
            goto fail;
        }
    }
    TS_CHECK_GOTO(ts_loader_set_epoch(ld, 0, 0));
    *out = ld;
    return TS_OK;
fail:
    ts_loader_free(ld);
    return st;
}

int64_t ts_loader_num_batches(const ts_loader *ld) { return ld->nb; }
int64_t ts_loader_epoch(const ts_loader *ld) { return ld->epoch; }
int64_t ts_loader_batch_index(const ts_loader *ld) { return ld->next; }

const int64_t *ts_loader_order(const ts_loader *ld, int64_t *n) {
    if (n) *n = ld->len;
    return ld->order;
}

ts_status ts_loader_set_epoch(ts_loader *ld, int64_t epoch, int64_t start_batch) {
    TS_ARG(ld, "ts_loader_set_epoch: NULL loader");
    TS_ARG(epoch >= 0, "ts_loader_set_epoch: negative epoch %lld", (long long)epoch);
    int64_t B = ld->o.batch_size, nb = ld->o.drop_last ? ld->n / B : (ld->n + B - 1) / B;
    TS_ARG(start_batch >= 0 && start_batch <= nb, "ts_loader_set_epoch: start batch %lld is out of range [0, %lld]",
           (long long)start_batch, (long long)nb);
    TS_TRY(loader_layout(ld, ld->n)); /* back to the loader's own order after ts_loader_set_indices */
    for (int64_t i = 0; i < ld->n; i++) ld->order[i] = i;
    if (ld->o.shuffle) {
        ts_rng r;
        ts_rng_seed(&r, ld->o.seed ^ ((uint64_t)epoch * 0x9E3779B97F4A7C15ull));
        ts_rng_shuffle_i64(&r, ld->order, ld->n);
    }
    ld->epoch = epoch;
    ld->next = start_batch;
    return TS_OK;
}

ts_status ts_loader_set_indices(ts_loader *ld, const int64_t *idx, int64_t n, int64_t start_batch) {
    TS_ARG(ld, "ts_loader_set_indices: NULL loader");
    TS_ARG(n >= 0, "ts_loader_set_indices: negative count %lld", (long long)n);
    TS_ARG(idx || n == 0, "ts_loader_set_indices: NULL indices");
    for (int64_t k = 0; k < n; k++)
        TS_ARG(idx[k] >= 0 && idx[k] < ld->n,
               "ts_loader_set_indices: index %lld at position %lld is out of range [0, %lld) (dataset size)",
               (long long)idx[k], (long long)k, (long long)ld->n);
    int64_t B = ld->o.batch_size, nb = ld->o.drop_last ? n / B : (n + B - 1) / B;
    TS_ARG(start_batch >= 0 && start_batch <= nb,
           "ts_loader_set_indices: start batch %lld is out of range [0, %lld] (%lld indices, batch size %lld)",
           (long long)start_batch, (long long)nb, (long long)n, (long long)B);
    int64_t *grown = NULL;
    if (n > ld->cap && !(grown = ts__malloc(sizeof(int64_t) * (size_t)n))) return TS_ERR_NOMEM;
    ts_status st = loader_layout(ld, n);
    if (st != TS_OK) {
        free(grown);
        return st;
    }
    if (grown) {
        free(ld->order);
        ld->order = grown;
        ld->cap = n;
    }
    if (n) memcpy(ld->order, idx, sizeof(int64_t) * (size_t)n);
    ld->next = start_batch;
    return TS_OK;
}

ts_status ts_loader_next(ts_loader *ld, ts_tensor **x, ts_tensor **y) {
    TS_ARG(ld && x && y, "ts_loader_next: NULL argument");
    *x = *y = NULL;
    if (ld->next >= ld->nb) return TS_OK;
    int64_t B = ld->o.batch_size, start = ld->next * B, cnt = TS_MIN(B, ld->len - start);
    ts_tensor *bx = cnt == B ? ld->xb : ld->xt, *by = cnt == B ? ld->yb : ld->yt;
    float *hx = ld->hx ? ld->hx : ts__f32(ld->xb);
    int64_t *hy = ld->hy ? ld->hy : (int64_t *)ts__ptr(ld->yb);
    const int64_t *idx = ld->order + start;
    const ts_dataset *ds = ld->ds;
    if (ds->ops->get_batch) {
        TS_TRY(ds->ops->get_batch(ds->impl, idx, cnt, hx, hy));
    } else {
        for (int64_t k = 0; k < cnt; k++) TS_TRY(ds->ops->get(ds->impl, idx[k], hx + k * ds->sample_numel, hy + k));
    }
    if (ld->hx) {
        TS_TRY(ts_tensor_from_host(bx, hx, ts_tensor_nbytes(bx)));
        TS_TRY(ts_tensor_from_host(by, hy, ts_tensor_nbytes(by)));
    }
    ld->next++;
    *x = bx;
    *y = by;
    return TS_OK;
}
