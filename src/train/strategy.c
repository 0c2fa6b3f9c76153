/*
 * train/strategy.c — the strategy table and the public ts_strategy_* calls
 * (tessera/train.h). Each strategy lives in its own file (strategy.h).
 */
#include "train/strategy.h"
#include "tessera/parallel.h"
#include "core/timeline.h"

#include <math.h>
#include <stdio.h>
#include <strings.h>

static const ts__strategy_impl *const strategies[TS_STRATEGY_COUNT] = {
    [TS_STRATEGY_NONE] = &ts__strategy_none,         [TS_STRATEGY_DDP] = &ts__strategy_ddp,
    [TS_STRATEGY_DATA] = &ts__strategy_data,         [TS_STRATEGY_MODEL] = &ts__strategy_model,
    [TS_STRATEGY_PIPELINE] = &ts__strategy_pipeline, [TS_STRATEGY_TILE] = &ts__strategy_tile,
};

static const ts__strategy_impl *impl_of(ts_strategy_kind k) {
    return (int)k >= 0 && k < TS_STRATEGY_COUNT ? strategies[k] : NULL;
}

const char *ts_strategy_kind_name(ts_strategy_kind k) { return impl_of(k) ? impl_of(k)->name : NULL; }
const char *ts_strategy_kind_help(ts_strategy_kind k) { return impl_of(k) ? impl_of(k)->help : NULL; }

ts_status ts_strategy_kind_parse(const char *name, ts_strategy_kind *out) {
    TS_ARG(out, "ts_strategy_kind_parse: NULL argument");
    for (int k = 0; name && k < TS_STRATEGY_COUNT; k++)
        if (strcasecmp(name, strategies[k]->name) == 0) {
            *out = (ts_strategy_kind)k;
            return TS_OK;
        }
    char names[256];
    size_t len = 0;
    for (int k = 0; k < TS_STRATEGY_COUNT && len < sizeof names; k++)
        len += (size_t)snprintf(names + len, sizeof names - len, "%s%s", k ? ", " : "", strategies[k]->name);
    return ts_error(TS_ERR_INVALID_ARG, "unknown strategy '%s' (expected %s)", name ? name : "(null)", names);
}

void ts__strategy_describe_devices(ts_strategy *s) {
    size_t len = strlen(s->desc);
    for (int i = 0; i < s->ndev && len < sizeof s->desc; i++)
        len += (size_t)snprintf(s->desc + len, sizeof s->desc - len, "%s%s", i ? ", " : " over ",
                                ts_device_name(s->devs[i]));
}

ts_status ts__strategy_one_device(ts_strategy *s, const ts_strategy_opts *o, ts_device **dev) {
    if (o->devices && o->num_devices != 1)
        return ts_error(TS_ERR_INVALID_ARG, "one process on one device: %d devices given", o->num_devices);
    if (o->devices && !o->devices[0]) return ts_error(TS_ERR_INVALID_ARG, "%s: device 0 is NULL", s->impl->name);
    *dev = o->devices ? o->devices[0] : ts_device_cpu();
    s->devs[0] = *dev;
    s->ndev = 1;
    return TS_OK;
}

ts_status ts__strategy_place(ts_strategy *s, ts_module *model, ts_device *dev) {
    if (dev == ts_device_cpu()) return TS_OK;
    ts_module *seq = NULL, *to = NULL;
    TS_TRY(ts_module_to(model, dev));
    TS_TRY(ts_nn_sequential_new(&seq));
    ts_status st = ts_nn_to_device_new(dev, &to);
    if (st == TS_OK) st = ts_nn_sequential_add(seq, "to_device", to); /* takes `to`, also on failure */
    if (st != TS_OK) {
        ts_module_free(seq);
        return st; /* s->runner (the model) is freed with the strategy */
    }
    s->runner = seq; /* from here seq owns the model, also when adding it fails */
    ts_module *keep = s->model;
    s->model = NULL;
    TS_TRY(ts_nn_sequential_add(seq, "module", model));
    s->model = keep;
    return TS_OK;
}

ts_status ts__strategy_backward(ts_strategy *s, ts_tensor *loss) {
    if (s->loss_scale == 1.0f) return ts_backward(loss, NULL, false);
    ts_tensor *seed = NULL;
    TS_TRY(ts_tensor_full(ts_tensor_device(loss), ts_tensor_ndim(loss), ts_tensor_shape(loss), s->loss_scale, &seed));
    ts_status st = ts_backward(loss, seed, false);
    ts_tensor_release(seed);
    return st;
}

ts_status ts__strategy_can_scale_loss(const ts_strategy *s) {
    if (s->impl->kind == TS_STRATEGY_PIPELINE) /* its micro-batches' backward seeds are the pipeline's own */
        return ts_error(TS_ERR_UNSUPPORTED, "loss scaling (float16 training) is not available with --strategy pipeline");
    return TS_OK;
}

ts_status ts__strategy_set_loss_scale(ts_strategy *s, float scale) {
    TS_ARG(scale > 0 && isfinite(scale), "loss scale %g: want a finite value > 0", (double)scale);
    if (scale != 1.0f) TS_TRY(ts__strategy_can_scale_loss(s));
    s->loss_scale = scale;
    return TS_OK;
}

ts_status ts__strategy_batch_to(ts_device *dev, const ts_tensor *x, const ts_tensor *y, ts_tensor **xd,
                                ts_tensor **yd) {
    *xd = *yd = NULL;
    TS_TRY(ts_to_device(x, dev, xd));
    ts_status st = ts_to_device(y, dev, yd);
    if (st != TS_OK) {
        ts_tensor_release(*xd);
        *xd = NULL;
    }
    return st;
}

/* opts->devices, or every virtual CPU device. */
static ts_status take_devices(ts_strategy *s, const ts_strategy_opts *o) {
    if (o->devices) {
        if (o->num_devices < 1 || o->num_devices > TS_STRATEGY_MAX_DEVICES)
            return ts_error(TS_ERR_INVALID_ARG, "%s: %d devices (want 1 to %d)", s->impl->name, o->num_devices,
                            TS_STRATEGY_MAX_DEVICES);
        for (int i = 0; i < o->num_devices; i++) {
            if (!o->devices[i]) return ts_error(TS_ERR_INVALID_ARG, "%s: device %d is NULL", s->impl->name, i);
            s->devs[i] = o->devices[i];
        }
        s->ndev = o->num_devices;
        return TS_OK;
    }
    int n = ts_cpu_device_count();
    for (int i = 0; i < n && i < TS_STRATEGY_MAX_DEVICES; i++) {
        char name[16];
        snprintf(name, sizeof name, "cpu:%d", i);
        TS_TRY(ts_device_get(name, &s->devs[i]));
        s->ndev = i + 1;
    }
    return TS_OK;
}

ts_status ts_strategy_new(ts_module *model, const ts_strategy_opts *o, ts_strategy **out) {
    ts_status st = TS_OK;
    ts_strategy *s = NULL;
    if (out) *out = NULL;
    if (!model || !o || !out) {
        st = ts_error(TS_ERR_INVALID_ARG, "ts_strategy_new: NULL argument");
        goto fail;
    }
    if (o->size != sizeof *o || o->magic != TS_STRATEGY_OPTS_MAGIC || o->version != TS_STRATEGY_OPTS_VERSION) {
        st = ts_error(TS_ERR_INVALID_ARG, "ts_strategy_new: options not initialised with TS_STRATEGY_OPTS_INIT");
        goto fail;
    }
    if (!impl_of(o->kind)) {
        st = ts_error(TS_ERR_INVALID_ARG, "ts_strategy_new: unknown strategy kind %d", (int)o->kind);
        goto fail;
    }
    if (!(s = ts__calloc(1, sizeof *s))) {
        st = TS_ERR_NOMEM;
        goto fail;
    }
    s->impl = impl_of(o->kind);
    s->loss_scale = 1.0f;
    if (s->impl->needs_devices) TS_CHECK_GOTO(take_devices(s, o));
    st = s->impl->wrap(s, model, o); /* owns the model from here, also on failure */
    model = NULL;
    if (st != TS_OK) {
        ts__error_prefix(st, "--strategy %s", s->impl->name);
        goto fail;
    }
    *out = s;
    return TS_OK;
fail:
    ts_strategy_free(s);
    ts_module_free(model);
    return st;
}

void ts_strategy_free(ts_strategy *s) {
    if (!s) return;
    if (s->impl && s->impl->destroy) s->impl->destroy(s);
    ts_module_free(s->runner);
    free(s);
}

ts_strategy_kind ts_strategy_kind_of(const ts_strategy *s) { return s->impl->kind; }
ts_module *ts_strategy_model(ts_strategy *s) { return s ? s->model : NULL; }
ts_module *ts_strategy_module(ts_strategy *s) { return s ? s->runner : NULL; }
int ts_strategy_rank(const ts_strategy *s) { return s && s->pg ? ts_pg_rank(s->pg) : 0; }
int ts_strategy_world_size(const ts_strategy *s) { return s && s->pg ? ts_pg_size(s->pg) : 1; }
ts_ddp *ts_strategy_ddp(ts_strategy *s) { return s ? s->ddp : NULL; }

int ts_strategy_devices(const ts_strategy *s, ts_device **devs, int max) {
    if (!s) return 0;
    for (int i = 0; devs && i < s->ndev && i < max; i++) devs[i] = s->devs[i];
    return s->ndev;
}

void ts_strategy_describe(const ts_strategy *s, char *buf, size_t n) {
    if (buf && n) snprintf(buf, n, "%s", s ? s->desc : "");
}

void ts_strategy_train(ts_strategy *s, bool training) {
    if (s) ts_module_train(s->runner, training);
}

ts_status ts__strategy_read_loss(const ts_tensor *lt, float *loss) {
    float v = 0.0f;
    ts_status st = ts_tensor_numel(lt) == 1 ? ts_tensor_to_host(lt, &v, sizeof v)
                                            : ts_error(TS_ERR_SHAPE, "the loss has %lld elements, not one",
                                                       (long long)ts_tensor_numel(lt));
    if (st == TS_OK) *loss = v;
    return st;
}

ts_status ts_strategy_forward_backward(ts_strategy *s, const ts_tensor *x, const ts_tensor *y, float label_smoothing,
                                       float *loss) {
    TS_ARG(s && x && y, "ts_strategy_forward_backward: NULL argument");
    float l = 0.0f;
    ts_status st;
    if (s->impl->forward_backward) {
        st = s->impl->forward_backward(s, x, y, label_smoothing, &l);
    } else {
        ts_tensor *logits = NULL, *lt = NULL;
        double t0 = ts__tl_now(); /* the timeline's forward and backward (core/timeline.h) */
        st = ts_module_forward(s->runner, x, &logits);
        if (st == TS_OK) st = ts__cross_entropy_seq(logits, y, label_smoothing, &lt);
        ts__tl_span(TS__TL_TRAINER, "forward", t0);
        t0 = ts__tl_now();
        if (st == TS_OK) st = ts__strategy_backward(s, lt);
        if (st == TS_OK) st = ts__strategy_read_loss(lt, &l);
        ts__tl_span(TS__TL_TRAINER, "backward", t0);
        ts_tensor_release(lt);
        ts_tensor_release(logits);
    }
    if (st == TS_OK && loss) *loss = l;
    return st;
}
