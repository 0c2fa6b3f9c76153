/*
 * python/src/train.c — the trainer from Python: tessera._tessera.train(fields, callback) runs the library's
 * run (ts_run_config from `tessera train`'s field names, ts_run_open, ts_run_train) with the GIL released,
 * calling back into Python on the trainer's events; Ctrl-C and an exception in the callback stop the run at
 * the next event (a job's other ranks then fail fast: the run aborts its group). Also the exports:
 * safetensors from a checkpoint or a dict of tensors, ONNX from a checkpoint or a zoo model.
 */
#include "tspy.h"

#include <math.h>
#include <string.h>

/* ---- the config from a dict ---------------------------------------------------------------------------- */

/* value's text form for ts_run_config_set, as a new bytes object (kept alive by the caller: string fields
 * borrow it): bool -> "true"/"false", int and float -> their decimal form, str and path-like as they are. */
static PyObject *field_text(PyObject *key, PyObject *value) {
    if (PyBool_Check(value)) return PyBytes_FromString(value == Py_True ? "true" : "false");
    if (PyLong_Check(value) || PyFloat_Check(value)) {
        PyObject *s = PyObject_Str(value);
        PyObject *b = s ? PyUnicode_AsUTF8String(s) : NULL;
        Py_XDECREF(s);
        return b;
    }
    PyObject *b = NULL;
    if (PyUnicode_Check(value) || PyObject_HasAttrString(value, "__fspath__")) {
        if (PyUnicode_FSConverter(value, &b)) return b;
        return NULL;
    }
    PyObject *tn = PyType_GetName(Py_TYPE(value));
    PyErr_Format(PyExc_TypeError, "tessera.train: %U: expected a number, a bool, a string or a path, not %U", key, tn);
    Py_XDECREF(tn);
    return NULL;
}

/* c from fields ({name: value}, None values left at their defaults); *keep gets the list of bytes objects the
 * config's strings point into. -1 with an exception set on failure. */
static int config_from_dict(PyObject *fields, ts_run_config *c, PyObject **keep) {
    *keep = PyList_New(0);
    if (!*keep) return -1;
    PyObject *key, *value;
    Py_ssize_t pos = 0;
    while (PyDict_Next(fields, &pos, &key, &value)) {
        if (!PyUnicode_Check(key)) {
            PyErr_SetString(PyExc_TypeError, "tessera.train: field names must be strings");
            return -1;
        }
        if (value == Py_None) continue;
        const char *name = PyUnicode_AsUTF8AndSize(key, NULL);
        PyObject *text = name ? field_text(key, value) : NULL;
        if (!text || PyList_Append(*keep, text) < 0) {
            Py_XDECREF(text);
            return -1;
        }
        Py_DECREF(text);
        ts_status st = ts_run_config_set(c, name, PyBytes_AsString(text));
        if (st != TS_OK) {
            tspy_raise(st);
            return -1;
        }
    }
    return 0;
}

/* ---- events -------------------------------------------------------------------------------------------- */

typedef struct train_ctx {
    PyObject *callback;              /* borrowed; may be None */
    PyObject *exc_type, *exc, *tb;   /* what stopped the run from Python (the callback's exception, Ctrl-C) */
} train_ctx;

static const char *const event_kinds[] = {[TS_TRAIN_STEP] = "step", [TS_TRAIN_EPOCH_END] = "epoch_end",
                                          [TS_TRAIN_CHECKPOINT] = "checkpoint", [TS_TRAIN_EVAL] = "eval"};

static PyObject *eval_dict(const ts_eval_result *e) {
    return Py_BuildValue("{s:L,s:d,s:d,s:d}", "samples", (long long)e->samples, "accuracy", e->accuracy,
                         "top5_accuracy", e->top5_accuracy, "loss", e->loss);
}

static PyObject *event_dict(const ts_train_event *ev) {
    PyObject *eval = ev->eval ? eval_dict(ev->eval) : Py_NewRef(Py_None);
    if (!eval) return NULL;
    double ips = ev->epoch_seconds > 0 ? (double)ev->epoch_images / ev->epoch_seconds : 0.0;
    double tps = ev->epoch_seconds > 0 ? (double)ev->epoch_tokens / ev->epoch_seconds : 0.0;
    PyObject *d = Py_BuildValue(
        "{s:s,s:i,s:L,s:L,s:L,s:L,s:L,s:d,s:d,s:d,s:d,s:d,s:d,s:O,s:s}", "kind", event_kinds[ev->kind], "rank",
        ev->rank, "epoch", (long long)ev->epoch, "epochs", (long long)ev->epochs, "batch", (long long)ev->batch,
        "num_batches", (long long)ev->num_batches, "step", (long long)ev->step, "loss", ev->loss, "mean_loss",
        ev->mean_loss, "lr", ev->lr, "images_per_second", ips, "tokens_per_second", tps, "grad_norm",
        ev->grad_norm, "eval", eval, "checkpoint", ev->kind == TS_TRAIN_CHECKPOINT && ev->checkpoint ? ev->checkpoint : "");
    Py_DECREF(eval);
    return d;
}

/* The trainer's callback (on the training thread, GIL released around it): a pending Ctrl-C first, then the
 * Python callback; either one's exception is kept for the caller and stops the run. */
static ts_status on_event(const ts_train_event *ev, void *user) {
    train_ctx *ctx = user;
    PyGILState_STATE g = PyGILState_Ensure();
    int failed = PyErr_CheckSignals();
    if (!failed && ctx->callback != Py_None) {
        PyObject *d = event_dict(ev);
        PyObject *r = d ? PyObject_CallFunctionObjArgs(ctx->callback, d, NULL) : NULL;
        failed = r == NULL;
        Py_XDECREF(r);
        Py_XDECREF(d);
    }
    if (failed) PyErr_Fetch(&ctx->exc_type, &ctx->exc, &ctx->tb);
    PyGILState_Release(g);
    return failed ? ts_error(TS_ERR_STATE, "the run was stopped from Python (an exception in the callback, or "
                                           "Ctrl-C)")
                  : TS_OK;
}

static PyObject *result_dict(const ts_train_result *r, ts_run *run) {
    const ts_run_config *c = ts_run_config_of(run);
    PyObject *eval = r->eval.samples > 0 ? eval_dict(&r->eval) : Py_NewRef(Py_None);
    if (!eval) return NULL;
    PyObject *d = Py_BuildValue("{s:L,s:L,s:L,s:d,s:d,s:L,s:d,s:d,s:O,s:L,s:d,s:L,s:i,s:i,s:s,s:L,s:L}", "steps",
                                (long long)r->steps, "epochs", (long long)r->epochs, "images", (long long)r->images,
                                "train_seconds", r->train_seconds, "images_per_second", r->images_per_second,
                                "tokens", (long long)r->tokens, "tokens_per_second", r->tokens_per_second,
                                "final_loss", r->final_loss, "eval", eval, "skipped_steps", (long long)r->skipped_steps,
                                "loss_scale", (double)r->loss_scale, "skipped_samples", (long long)r->skipped_samples,
                                "rank", ts_run_rank(run), "world_size", ts_run_world_size(run), "model", c->model,
                                "num_classes", (long long)c->num_classes, "image_size", (long long)c->image_size);
    Py_DECREF(eval);
    return d;
}

/* _tessera.train(fields: dict, callback=None) -> dict */
static PyObject *train(PyObject *mod, PyObject *args, PyObject *kw) {
    (void)mod;
    static char *names[] = {"fields", "callback", NULL};
    PyObject *fields, *callback = Py_None, *keep = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O!|O", names, &PyDict_Type, &fields, &callback)) return NULL;
    if (callback != Py_None && !PyCallable_Check(callback)) {
        PyErr_SetString(PyExc_TypeError, "tessera.train: callback must be callable (it gets one dict per event)");
        return NULL;
    }
    train_ctx ctx = {callback, NULL, NULL, NULL};
    ts_run_config c = TS_RUN_CONFIG_INIT;
    c.callback = on_event;
    c.user = &ctx;
    /* model=<tessera.nn.Module> (ops.c / modules.c): the run trains that module in place (c.module, borrowed:
     * `fields` keeps the object alive); the other fields as they are. */
    PyObject *model = PyDict_GetItemString(fields, "model"); /* borrowed */
    if (model && model != Py_None && !PyUnicode_Check(model) && PyObject_HasAttrString(model, "_h")) {
        if (!(c.module = tspy_module_get(model)) || !(fields = PyDict_Copy(fields))) return NULL;
        int r = PyDict_DelItemString(fields, "model") < 0 ? -1 : config_from_dict(fields, &c, &keep);
        Py_DECREF(fields); /* the module object stays referenced by the caller's dict */
        if (r < 0) goto fail;
    } else if (config_from_dict(fields, &c, &keep) < 0) {
        goto fail;
    }
    tspy_module_error_clear();
    ts_status st = ts_run_config_check(&c);
    if (st != TS_OK) {
        tspy_raise(st);
        goto fail;
    }
    if (ts_run_processes_to_start(&c) > 0) {
        PyErr_Format(tspy_error_class(TS_ERR_INVALID_ARG), "nproc %lld: tessera.train trains in this process, one rank of a job; "
                     "start %lld of them with `tessera run -n %lld python SCRIPT` or torchrun",
                     (long long)c.nproc, (long long)c.nproc, (long long)c.nproc);
        goto fail;
    }
    ts_run *run = NULL;
    ts_train_result r;
    Py_BEGIN_ALLOW_THREADS st = ts_run_open(&c, &run);
    if (st == TS_OK) st = ts_run_train(run, &r);
    Py_END_ALLOW_THREADS
    PyObject *out = NULL;
    if (ctx.exc_type) {
        PyErr_Restore(ctx.exc_type, ctx.exc, ctx.tb); /* the callback's exception, or KeyboardInterrupt */
    } else if (st != TS_OK && tspy_module_error_restore()) {
        /* the exception a Python module's forward raised (model=<tessera.nn.Module>) */
    } else if (st != TS_OK) {
        tspy_raise(st);
    } else {
        out = result_dict(&r, run);
    }
    Py_BEGIN_ALLOW_THREADS ts_run_free(run);
    Py_END_ALLOW_THREADS
    Py_DECREF(keep);
    return out;
fail:
    Py_XDECREF(keep);
    return NULL;
}

/* ---- what a run can be told ---------------------------------------------------------------------------- */

/* The field's value in c as a Python object (None for an unset string). */
static PyObject *field_value(const ts_run_config *c, const ts_run_field *f) {
    const char *p = (const char *)c + f->offset;
    int64_t i;
    double d;
    const char *s;
    bool b;
    int e;
    switch (f->kind) {
    case TS_RUN_FIELD_INT: memcpy(&i, p, sizeof i); return PyLong_FromLongLong(i);
    case TS_RUN_FIELD_FLOAT: memcpy(&d, p, sizeof d); return PyFloat_FromDouble(d);
    case TS_RUN_FIELD_STRING: memcpy(&s, p, sizeof s); return s ? PyUnicode_FromString(s) : Py_NewRef(Py_None);
    case TS_RUN_FIELD_BOOL: memcpy(&b, p, sizeof b); return PyBool_FromLong(b);
    case TS_RUN_FIELD_ENUM: memcpy(&e, p, sizeof e); return PyUnicode_FromString(f->value_name(e));
    }
    return Py_NewRef(Py_None);
}

static PyObject *field_dict(const ts_run_config *defaults, const ts_run_field *f) {
    static const char *const kinds[] = {[TS_RUN_FIELD_INT] = "int", [TS_RUN_FIELD_FLOAT] = "float",
                                        [TS_RUN_FIELD_STRING] = "str", [TS_RUN_FIELD_BOOL] = "bool",
                                        [TS_RUN_FIELD_ENUM] = "enum"};
    bool number = f->kind == TS_RUN_FIELD_INT || f->kind == TS_RUN_FIELD_FLOAT;
    PyObject *choices = f->kind == TS_RUN_FIELD_ENUM ? PyList_New(0) : Py_NewRef(Py_None);
    for (int v = (int)f->min; choices && f->kind == TS_RUN_FIELD_ENUM && v <= (int)f->max; v++) {
        PyObject *n = PyUnicode_FromString(f->value_name(v));
        if (!n || PyList_Append(choices, n) < 0) Py_CLEAR(choices);
        Py_XDECREF(n);
    }
    /* numbers: min and max as the field's type ("d" for floats, "L" for ints); else None */
    PyObject *range = !number ? Py_BuildValue("(OO)", Py_None, Py_None)
                      : f->kind == TS_RUN_FIELD_INT ? Py_BuildValue("(LL)", (long long)f->min, (long long)f->max)
                                                    : Py_BuildValue("(dd)", f->min, f->max);
    PyObject *def = field_value(defaults, f);
    PyObject *d = choices && range && def
                      ? Py_BuildValue("{s:s,s:s,s:s,s:O,s:O,s:O,s:O,s:s}", "name", f->name, "flag", f->flag, "kind",
                                      kinds[f->kind], "default", def, "choices", choices, "min",
                                      PyTuple_GetItem(range, 0), "max", PyTuple_GetItem(range, 1), "help", f->help)
                      : NULL;
    Py_XDECREF(choices);
    Py_XDECREF(range);
    Py_XDECREF(def);
    return d;
}

/* _tessera.run_fields() -> [dict]: every field tessera.train takes, with its kind, default, range and help. */
static PyObject *run_fields(PyObject *mod, PyObject *unused) {
    (void)mod, (void)unused;
    int n = 0;
    const ts_run_field *f = ts_run_fields(&n);
    ts_run_config defaults = TS_RUN_CONFIG_INIT;
    PyObject *l = PyList_New(0);
    for (int i = 0; l && i < n; i++) {
        PyObject *d = field_dict(&defaults, &f[i]);
        if (!d || PyList_Append(l, d) < 0) Py_CLEAR(l);
        Py_XDECREF(d);
    }
    return l;
}

/* ---- exports ------------------------------------------------------------------------------------------- */

/* _tessera.export_safetensors(checkpoint, out) -> int: the model's tensors of a checkpoint as safetensors. */
static PyObject *export_safetensors(PyObject *mod, PyObject *args, PyObject *kw) {
    (void)mod;
    static char *names[] = {"checkpoint", "out", NULL};
    PyObject *ck = NULL, *out = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O&O&", names, PyUnicode_FSConverter, &ck, PyUnicode_FSConverter, &out)) return NULL;
    int n = 0;
    ts_status st;
    const char *ckp = PyBytes_AsString(ck), *outp = PyBytes_AsString(out);
    Py_BEGIN_ALLOW_THREADS st = ts_safetensors_export_ckpt(ckp, outp, &n);
    Py_END_ALLOW_THREADS
    Py_DECREF(ck);
    Py_DECREF(out);
    if (st != TS_OK) return tspy_raise(st);
    return PyLong_FromLong(n);
}

/* The {name: tensor} dict as a list (tensors shared, not copied); -1 with an exception set on failure. */
static int list_from_dict(PyObject *tensors, ts_tensor_list *l) {
    PyObject *key, *value;
    Py_ssize_t pos = 0;
    while (PyDict_Next(tensors, &pos, &key, &value)) {
        const char *name = PyUnicode_Check(key) ? PyUnicode_AsUTF8AndSize(key, NULL) : NULL;
        if (!name) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "tessera.save_safetensors: names must be strings");
            return -1;
        }
        ts_tensor *t = NULL;
        if (tspy_tensor_from_object(value, &t) < 0) return -1;
        ts_status st = ts_tensor_list_append(l, name, t);
        ts_tensor_release(t);
        if (st != TS_OK) {
            tspy_raise(st);
            return -1;
        }
    }
    return 0;
}

/* metadata {str: str} into m; -1 with an exception set on failure. */
static int meta_from_dict(PyObject *metadata, ts_safetensors_meta *m) {
    PyObject *key, *value;
    Py_ssize_t pos = 0;
    while (metadata && metadata != Py_None && PyDict_Next(metadata, &pos, &key, &value)) {
        const char *k = PyUnicode_Check(key) ? PyUnicode_AsUTF8AndSize(key, NULL) : NULL;
        const char *v = k && PyUnicode_Check(value) ? PyUnicode_AsUTF8AndSize(value, NULL) : NULL;
        if (!v) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "tessera.save_safetensors: metadata must be {str: str}");
            return -1;
        }
        ts_status st = ts_safetensors_meta_set(m, k, v);
        if (st != TS_OK) {
            tspy_raise(st);
            return -1;
        }
    }
    return 0;
}

/* _tessera.save_safetensors(tensors, path, metadata=None): {name: tensor} (torch, NumPy, tessera) written as a
 * safetensors file, atomically. */
static PyObject *save_safetensors(PyObject *mod, PyObject *args, PyObject *kw) {
    (void)mod;
    static char *names[] = {"tensors", "path", "metadata", NULL};
    PyObject *tensors, *path = NULL, *metadata = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O!O&|O", names, &PyDict_Type, &tensors, PyUnicode_FSConverter, &path, &metadata))
        return NULL;
    if (metadata != Py_None && !PyDict_Check(metadata)) {
        Py_DECREF(path);
        PyErr_SetString(PyExc_TypeError, "tessera.save_safetensors: metadata must be a dict of strings");
        return NULL;
    }
    ts_tensor_list l = TS_TENSOR_LIST_INIT;
    ts_safetensors_meta meta = TS_SAFETENSORS_META_INIT;
    PyObject *ret = NULL;
    if (list_from_dict(tensors, &l) == 0 && meta_from_dict(metadata, &meta) == 0) {
        ts_status st;
        const char *p = PyBytes_AsString(path);
        Py_BEGIN_ALLOW_THREADS st = ts_safetensors_save(p, &l, metadata == Py_None ? NULL : &meta);
        Py_END_ALLOW_THREADS
        ret = st == TS_OK ? Py_NewRef(Py_None) : tspy_raise(st);
    }
    ts_tensor_list_clear(&l);
    ts_safetensors_meta_clear(&meta);
    Py_DECREF(path);
    return ret;
}

/* shape (a sequence of ints or None: 0 dimensions) into dims; -1 with an exception set. */
static int shape_arg(PyObject *shape, int *ndim, int64_t *dims) {
    *ndim = 0;
    if (shape == Py_None) return 0;
    if (tspy_int64_list(shape, "tessera.export_onnx: input_shape", dims, ndim) < 0) return -1;
    if (*ndim > 0) return 0;
    PyErr_SetString(tspy_error_class(TS_ERR_INVALID_ARG), "tessera.export_onnx: input_shape is empty");
    return -1;
}

/* _tessera.export_onnx(out, checkpoint=None, model=None, input_shape=None, seed=0, dynamic_batch=True) -> str:
 * what `tessera export --format onnx` writes; returns the model's name. */
static PyObject *export_onnx(PyObject *mod, PyObject *args, PyObject *kw) {
    (void)mod;
    static char *names[] = {"out", "checkpoint", "model", "input_shape", "seed", "dynamic_batch", NULL};
    PyObject *out = NULL, *ck = NULL, *shape = Py_None;
    const char *model = NULL;
    unsigned long long seed = 0;
    int dynamic = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O&|O&zOKp", names, PyUnicode_FSConverter, &out, tspy_path_or_none, &ck, &model, &shape, &seed,
                                     &dynamic))
        return NULL;
    int ndim = 0;
    int64_t dims[TS_MAX_DIMS];
    PyObject *ret = NULL;
    if (shape_arg(shape, &ndim, dims) == 0) {
        const char *outp = PyBytes_AsString(out), *ckp = ck ? PyBytes_AsString(ck) : NULL, *name = NULL;
        ts_module *m = NULL;
        ts_tensor *x = NULL;
        ts_onnx_opts o = TS_ONNX_OPTS_INIT;
        o.dynamic_batch = dynamic;
        ts_status st;
        Py_BEGIN_ALLOW_THREADS st = ts_export_model_new(ckp, model, seed, ndim, dims, &m, &x, &name);
        if (st == TS_OK) st = ts_export_onnx(m, x, outp, &o);
        ts_tensor_release(x);
        ts_module_free(m);
        Py_END_ALLOW_THREADS
        ret = st == TS_OK ? PyUnicode_FromString(name) : tspy_raise(st);
    }
    Py_DECREF(out);
    Py_XDECREF(ck);
    return ret;
}

static PyMethodDef train_methods[] = {
    {"train", TSPY_KW(train), "train(fields, callback=None) -> dict: a training run (tessera.train)."},
    {"run_fields", run_fields, METH_NOARGS, "run_fields() -> [dict]: the fields tessera.train takes."},
    {"export_safetensors", TSPY_KW(export_safetensors),
     "export_safetensors(checkpoint, out) -> int: a checkpoint's model tensors as a safetensors file."},
    {"save_safetensors", TSPY_KW(save_safetensors),
     "save_safetensors(tensors, path, metadata=None): {name: tensor} as a safetensors file (atomically)."},
    {"export_onnx", TSPY_KW(export_onnx),
     "export_onnx(out, checkpoint=None, model=None, input_shape=None, seed=0, dynamic_batch=True) -> str"},
    {NULL, NULL, 0, NULL},
};

int tspy_add_train(PyObject *m) { return PyModule_AddFunctions(m, train_methods); }
