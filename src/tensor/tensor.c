/*
 * tensor/tensor.c — creation, refcounting, views and host copies of tensors.
 */
#include "tensor/tensor.h"
#include "device/k_ew.h"

#include <math.h>
#include <stdio.h>

int64_t ts__numel(int ndim, const int64_t *shape) {
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= shape[i];
    return n;
}

const char *ts_shape_str(int ndim, const int64_t *shape, char *buf, size_t n) {
    size_t o = 0;
    o += (size_t)snprintf(buf + o, n - o, "[");
    for (int i = 0; i < ndim && o < n; i++)
        o += (size_t)snprintf(buf + o, n - o, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (o < n) snprintf(buf + o, n - o, "]");
    return buf;
}

static void set_contiguous_strides(ts_tensor *t) {
    int64_t s = 1;
    for (int i = t->ndim - 1; i >= 0; i--) {
        t->stride[i] = s;
        s *= t->shape[i];
    }
}

static ts_status storage_new(ts_device *dev, size_t nbytes, ts_storage **out) {
    ts_storage *s = ts__calloc(1, sizeof *s);
    if (!s) return TS_ERR_NOMEM;
    s->device = dev;
    s->nbytes = nbytes;
    s->data = ts__device_alloc(dev, nbytes ? nbytes : 1);
    if (!s->data) {
        free(s);
        return TS_ERR_NOMEM;
    }
    atomic_init(&s->refcount, 1);
    *out = s;
    return TS_OK;
}

static void storage_release(ts_storage *s) {
    if (s && atomic_fetch_sub(&s->refcount, 1) == 1) {
        if (s->release) s->release(s->release_ctx);
        else ts__device_free(s->device, s->data, s->nbytes ? s->nbytes : 1);
        free(s);
    }
}

static ts_status check_shape(const char *fn, int ndim, const int64_t *shape) {
    if (ndim < 0 || ndim > TS_MAX_DIMS)
        return ts_error(TS_ERR_SHAPE, "%s: ndim %d is out of range [0, %d]", fn, ndim, TS_MAX_DIMS);
    if (ndim > 0 && !shape) return ts_error(TS_ERR_INVALID_ARG, "%s: NULL shape", fn);
    int64_t prod = 1; /* of the non-zero sizes: strides and element counts must fit int64 */
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0) return ts_error(TS_ERR_SHAPE, "%s: negative size %lld in dim %d", fn, (long long)shape[i], i);
        if (shape[i] > 1 && prod > (INT64_MAX / 16) / shape[i])
            return ts_error(TS_ERR_SHAPE, "%s: size %lld in dim %d makes more than 2^59 elements", fn,
                            (long long)shape[i], i);
        if (shape[i] > 1) prod *= shape[i];
    }
    return TS_OK;
}

static ts_tensor *tensor_alloc(void) {
    ts_tensor *t = ts__calloc(1, sizeof *t);
    if (t) atomic_init(&t->refcount, 1);
    return t;
}

ts_status ts__new(ts_device *dev, ts_dtype dt, int ndim, const int64_t *shape, ts_tensor **out) {
    TS_TRY(check_shape("ts_tensor_empty", ndim, shape));
    if (!dev) dev = ts_device_cpu();
    if ((int)dt < 0 || dt >= TS_DTYPE_COUNT) return ts_error(TS_ERR_DTYPE, "ts_tensor_empty: bad dtype %d", (int)dt);
    ts_tensor *t = tensor_alloc();
    if (!t) return TS_ERR_NOMEM;
    t->dtype = dt;
    t->ndim = ndim;
    for (int i = 0; i < ndim; i++) t->shape[i] = shape[i];
    set_contiguous_strides(t);
    ts_status st = storage_new(dev, (size_t)ts__numel(ndim, shape) * ts_dtype_size(dt), &t->storage);
    if (st != TS_OK) {
        free(t);
        return st;
    }
    *out = t;
    return TS_OK;
}

ts_status ts__tensor_wrap(ts_device *dev, ts_dtype dt, int ndim, const int64_t *shape, const int64_t *strides,
                          void *data, size_t nbytes, void (*release)(void *ctx), void *ctx, ts_tensor **out) {
    TS_TRY(check_shape("ts__tensor_wrap", ndim, shape));
    ts_tensor *t = tensor_alloc();
    ts_storage *s = ts__calloc(1, sizeof *s);
    if (!t || !s) {
        free(t);
        free(s);
        return TS_ERR_NOMEM;
    }
    t->dtype = dt;
    t->ndim = ndim;
    for (int i = 0; i < ndim; i++) t->shape[i] = shape[i];
    set_contiguous_strides(t);
    if (strides)
        for (int i = 0; i < ndim; i++) t->stride[i] = strides[i];
    s->device = dev;
    s->data = data;
    s->nbytes = nbytes;
    s->release = release;
    s->release_ctx = ctx;
    atomic_init(&s->refcount, 1);
    t->storage = s;
    *out = t;
    return TS_OK;
}

ts_status ts_tensor_empty(ts_device *dev, ts_dtype dt, int ndim, const int64_t *shape, ts_tensor **out) {
    TS_ARG(out, "ts_tensor_empty: NULL out");
    return ts__new(dev, dt, ndim, shape, out);
}

ts_status ts_tensor_zeros(ts_device *dev, ts_dtype dt, int ndim, const int64_t *shape, ts_tensor **out) {
    TS_ARG(out, "ts_tensor_zeros: NULL out");
    TS_TRY(ts__new(dev, dt, ndim, shape, out));
    ts_status st = (*out)->storage->device->ops->memset0((*out)->storage->device, ts__ptr(*out), ts_tensor_nbytes(*out));
    if (st != TS_OK) {
        ts_tensor_release(*out);
        *out = NULL;
    }
    return st;
}

ts_status ts_tensor_full(ts_device *dev, int ndim, const int64_t *shape, float value, ts_tensor **out) {
    TS_ARG(out, "ts_tensor_full: NULL out");
    TS_TRY(ts__new(dev, TS_F32, ndim, shape, out));
    ts_status st = ts_tensor_fill_(*out, value);
    if (st != TS_OK) {
        ts_tensor_release(*out);
        *out = NULL;
    }
    return st;
}

ts_status ts_tensor_from_data(ts_device *dev, ts_dtype dt, int ndim, const int64_t *shape, const void *data,
                              ts_tensor **out) {
    TS_ARG(out && (data || ts__numel(ndim, shape) == 0), "ts_tensor_from_data: NULL argument");
    TS_TRY(ts__new(dev, dt, ndim, shape, out));
    ts_status st = ts_tensor_from_host(*out, data, ts_tensor_nbytes(*out));
    if (st != TS_OK) {
        ts_tensor_release(*out);
        *out = NULL;
    }
    return st;
}

ts_status ts__scratch_f32(ts_device *dev, int64_t n, ts_tensor **out) {
    return ts__new(dev, TS_F32, 1, (int64_t[]){n > 0 ? n : 1}, out);
}

ts_status ts__scratch_bytes(ts_device *dev, size_t bytes, ts_tensor **out) {
    return ts__scratch_f32(dev, (int64_t)((bytes + 3) / 4), out);
}

ts_status ts__new_like(const ts_tensor *t, ts_tensor **out) {
    return ts__new(t->storage->device, t->dtype, t->ndim, t->shape, out);
}

ts_status ts__zeros_like(const ts_tensor *t, ts_tensor **out) {
    return ts_tensor_zeros(t->storage->device, t->dtype, t->ndim, t->shape, out);
}

ts_tensor *ts_tensor_retain(ts_tensor *t) {
    if (t) atomic_fetch_add(&t->refcount, 1);
    return t;
}

static _Atomic(const ts__autograd_hooks *) ts_autograd_hooks;

void ts__tensor_set_autograd_hooks(const ts__autograd_hooks *h) {
    atomic_store_explicit(&ts_autograd_hooks, h, memory_order_release);
}

void ts_tensor_release(ts_tensor *t) {
    if (!t) return;
    int prev = atomic_fetch_sub(&t->refcount, 1);
    TS_ASSERT(prev >= 1, "tensor released once too often (reference count was %d)", prev);
    if (prev != 1) return;
    if (t->grad_acc || t->grad_fn) {
        const ts__autograd_hooks *h = atomic_load_explicit(&ts_autograd_hooks, memory_order_acquire);
        TS_ASSERT(h != NULL, "a tensor holds autograd nodes but autograd installed no hooks");
        if (h && t->grad_acc) h->release_leaf(t->grad_acc);
        if (h && t->grad_fn) h->release_node(t->grad_fn);
    }
    ts_tensor_release(t->grad);
    storage_release(t->storage);
    free(t->hooks);
    free(t->name);
    free(t);
}

ts_status ts__view(const ts_tensor *t, int ndim, const int64_t *shape, ts_tensor **out) {
    TS_TRY(check_shape("ts_view", ndim, shape));
    ts_tensor *v = tensor_alloc();
    if (!v) return TS_ERR_NOMEM;
    v->dtype = t->dtype;
    v->ndim = ndim;
    for (int i = 0; i < ndim; i++) v->shape[i] = shape[i];
    set_contiguous_strides(v);
    v->offset = t->offset;
    v->storage = t->storage;
    atomic_fetch_add(&t->storage->refcount, 1);
    *out = v;
    return TS_OK;
}

ts_status ts_tensor_detach(const ts_tensor *t, ts_tensor **out) {
    TS_ARG(t && out, "ts_tensor_detach: NULL argument");
    TS_TRY(ts__view(t, t->ndim, t->shape, out));
    memcpy((*out)->stride, t->stride, sizeof t->stride);
    return TS_OK;
}

bool ts_tensor_is_contiguous(const ts_tensor *t) {
    int64_t s = 1;
    for (int i = t->ndim - 1; i >= 0; i--) {
        if (t->shape[i] != 1 && t->stride[i] != s) return false;
        s *= t->shape[i];
    }
    return true;
}

ts_status ts__contiguous(const ts_tensor *t, ts_tensor **out) {
    if (ts_tensor_is_contiguous(t)) {
        *out = ts_tensor_retain((ts_tensor *)t);
        return TS_OK;
    }
    TS_TRY(ts__new_like(t, out));
    ts_status st = t->storage->device->k_ew->copy(*out, t);
    if (st != TS_OK) {
        ts_tensor_release(*out);
        *out = NULL;
    }
    return st;
}

ts_status ts_tensor_clone(const ts_tensor *t, ts_tensor **out) {
    TS_ARG(t && out, "ts_tensor_clone: NULL argument");
    TS_TRY(ts__new_like(t, out));
    ts_status st = t->storage->device->k_ew->copy(*out, t);
    if (st != TS_OK) {
        ts_tensor_release(*out);
        *out = NULL;
    }
    return st;
}

ts_status ts_tensor_copy_(ts_tensor *dst, const ts_tensor *src) {
    TS_ARG(dst && src, "ts_tensor_copy_: NULL argument");
    char a[64], b[64];
    if (!ts__same_shape(dst, src) || dst->dtype != src->dtype)
        return ts_error(TS_ERR_SHAPE, "ts_tensor_copy_: destination %s %s, source %s %s",
                        ts_shape_str(dst->ndim, dst->shape, a, sizeof a), ts_dtype_name(dst->dtype),
                        ts_shape_str(src->ndim, src->shape, b, sizeof b), ts_dtype_name(src->dtype));
    ts_device *dd = dst->storage->device, *sd = src->storage->device;
    if (dd == sd) return dd->k_ew->copy(dst, src);
    if (!ts_tensor_is_contiguous(dst))
        return ts_error(TS_ERR_UNSUPPORTED, "ts_tensor_copy_: cross-device copy into a non-contiguous tensor");
    ts_tensor *c = NULL;
    TS_TRY(ts__contiguous(src, &c));
    ts_status st;
    if (sd->host_accessible)
        st = dd->ops->copy_h2d(dd, ts__ptr(dst), ts__ptr(c), ts_tensor_nbytes(c));
    else if (dd->host_accessible)
        st = sd->ops->copy_d2h(sd, ts__ptr(dst), ts__ptr(c), ts_tensor_nbytes(c));
    else if (dd->ops == sd->ops && dd->ops->copy_peer) /* two devices of one backend: device to device */
        st = dd->ops->copy_peer(dd, ts__ptr(dst), sd, ts__ptr(c), ts_tensor_nbytes(c));
    else {
        void *tmp = ts__malloc(ts_tensor_nbytes(c));
        st = tmp ? sd->ops->copy_d2h(sd, tmp, ts__ptr(c), ts_tensor_nbytes(c)) : TS_ERR_NOMEM;
        if (st == TS_OK) st = dd->ops->copy_h2d(dd, ts__ptr(dst), tmp, ts_tensor_nbytes(c));
        free(tmp);
    }
    ts_tensor_release(c);
    return st;
}

/* ---- properties ---------------------------------------------------------------- */
int ts_tensor_ndim(const ts_tensor *t) { return t->ndim; }
int64_t ts_tensor_dim(const ts_tensor *t, int i) {
    if (i < 0) i += t->ndim;
    return (i >= 0 && i < t->ndim) ? t->shape[i] : -1;
}
const int64_t *ts_tensor_shape(const ts_tensor *t) { return t->shape; }
const int64_t *ts_tensor_strides(const ts_tensor *t) { return t->stride; }
int64_t ts_tensor_numel(const ts_tensor *t) { return ts__numel(t->ndim, t->shape); }
size_t ts_tensor_nbytes(const ts_tensor *t) { return (size_t)ts_tensor_numel(t) * ts_dtype_size(t->dtype); }
ts_dtype ts_tensor_dtype(const ts_tensor *t) { return t->dtype; }
ts_device *ts_tensor_device(const ts_tensor *t) { return t->storage->device; }

bool ts__same_shape(const ts_tensor *a, const ts_tensor *b) {
    if (a->ndim != b->ndim) return false;
    for (int i = 0; i < a->ndim; i++)
        if (a->shape[i] != b->shape[i]) return false;
    return true;
}

void *ts_tensor_address(const ts_tensor *t) { return ts__ptr(t); }
void *ts_tensor_data(ts_tensor *t) { return t->storage->device->host_accessible ? ts__ptr(t) : NULL; }

float *ts_tensor_data_f32(ts_tensor *t) {
    return (t->dtype == TS_F32 && t->storage->device->host_accessible) ? ts__f32(t) : NULL;
}

ts_status ts_tensor_to_host(const ts_tensor *t, void *dst, size_t nbytes) {
    TS_ARG(t && (dst || nbytes == 0), "ts_tensor_to_host: NULL argument");
    if (nbytes != ts_tensor_nbytes(t))
        return ts_error(TS_ERR_INVALID_ARG, "ts_tensor_to_host: buffer of %zu bytes for a tensor of %zu bytes", nbytes,
                        ts_tensor_nbytes(t));
    ts_tensor *c = NULL;
    TS_TRY(ts__contiguous(t, &c));
    ts_device *d = c->storage->device;
    ts_status st = d->ops->copy_d2h(d, dst, ts__ptr(c), nbytes);
    ts_tensor_release(c);
    return st;
}

ts_status ts_tensor_from_host(ts_tensor *t, const void *src, size_t nbytes) {
    TS_ARG(t && (src || nbytes == 0), "ts_tensor_from_host: NULL argument");
    if (nbytes != ts_tensor_nbytes(t))
        return ts_error(TS_ERR_INVALID_ARG, "ts_tensor_from_host: %zu bytes for a tensor of %zu bytes", nbytes,
                        ts_tensor_nbytes(t));
    if (!ts_tensor_is_contiguous(t))
        return ts_error(TS_ERR_UNSUPPORTED, "ts_tensor_from_host: tensor is not contiguous");
    ts_device *d = t->storage->device;
    return d->ops->copy_h2d(d, ts__ptr(t), src, nbytes);
}

double ts_tensor_item(const ts_tensor *t, int64_t i) {
    if (i < 0 || i >= ts_tensor_numel(t)) return NAN;
    /* flat contiguous index -> strided offset */
    int64_t off = 0, rem = i;
    for (int d = t->ndim - 1; d >= 0; d--) {
        off += (rem % t->shape[d]) * t->stride[d];
        rem /= t->shape[d];
    }
    size_t es = ts_dtype_size(t->dtype);
    unsigned char buf[8];
    ts_device *dev = t->storage->device;
    dev->ops->copy_d2h(dev, buf, (char *)t->storage->data + (size_t)(t->offset + off) * es, es);
    switch (t->dtype) {
    case TS_F32: { float f; memcpy(&f, buf, 4); return f; }
    case TS_I64: { int64_t v; memcpy(&v, buf, 8); return (double)v; }
    case TS_I32: { int32_t v; memcpy(&v, buf, 4); return v; }
    case TS_U8: return buf[0];
    case TS_F16: { uint16_t h; memcpy(&h, buf, 2); return ts_f16_to_f32(h); }
    case TS_BF16: { uint16_t h; memcpy(&h, buf, 2); return ts_bf16_to_f32(h); }
    default: return NAN;
    }
}

ts_status ts_tensor_fill_(ts_tensor *t, float value) {
    TS_TRY(ts__check_f32("ts_tensor_fill_", "t", t));
    return t->storage->device->k_ew->fill(t, value);
}

static ts_status fill_random(ts_tensor *t, int normal, float a, float b, ts_rng *rng) {
    TS_TRY(ts__check_f32(normal ? "ts_tensor_normal_" : "ts_tensor_uniform_", "t", t));
    if (!rng) rng = ts_rng_default();
    int64_t n = ts_tensor_numel(t);
    float *buf = ts__malloc((size_t)n * sizeof(float));
    if (!buf) return TS_ERR_NOMEM;
    for (int64_t i = 0; i < n; i++)
        buf[i] = normal ? (float)(a + b * ts_rng_normal(rng)) : (float)(a + (b - a) * ts_rng_uniform(rng));
    ts_status st = ts_tensor_from_host(t, buf, (size_t)n * sizeof(float));
    free(buf);
    return st;
}

ts_status ts_tensor_uniform_(ts_tensor *t, float lo, float hi, ts_rng *rng) { return fill_random(t, 0, lo, hi, rng); }
ts_status ts_tensor_normal_(ts_tensor *t, float mean, float std, ts_rng *rng) {
    return fill_random(t, 1, mean, std, rng);
}

void ts_tensor_set_name(ts_tensor *t, const char *name) {
    free(t->name);
    t->name = ts__strdup(name);
}
const char *ts_tensor_name(const ts_tensor *t) { return t->name ? t->name : ""; }

/* ---- checks used by ops ---------------------------------------------------------------- */
ts_status ts__check_f32(const char *op, const char *arg, const ts_tensor *t) {
    if (!t) return ts_error(TS_ERR_INVALID_ARG, "%s: %s is NULL", op, arg);
    if (t->dtype != TS_F32)
        return ts_error(TS_ERR_DTYPE, "%s: %s has dtype %s, expected float32", op, arg, ts_dtype_name(t->dtype));
    return TS_OK;
}

ts_status ts__check_ndim(const char *op, const char *arg, const ts_tensor *t, int ndim) {
    char b[96];
    if (!t) return ts_error(TS_ERR_INVALID_ARG, "%s: %s is NULL", op, arg);
    if (t->ndim != ndim)
        return ts_error(TS_ERR_SHAPE, "%s: %s has shape %s, expected %d dimensions", op, arg,
                        ts_shape_str(t->ndim, t->shape, b, sizeof b), ndim);
    return TS_OK;
}

ts_status ts__check_same_device(const char *op, const ts_tensor *a, const ts_tensor *b) {
    if (a && b && a->storage->device != b->storage->device)
        return ts_error(TS_ERR_DEVICE, "%s: tensors on different devices (%s and %s)", op, a->storage->device->name,
                        b->storage->device->name);
    return TS_OK;
}
