/*
 * python/src/pipeline.c — tessera.data's C part: `tessera._tessera.Pipeline`, a handle on a ts_pipeline (the
 * DALI-style reader + decoders + augmentation of include/tessera/pipeline.h), which tessera/data.py's
 * ImagePipeline drives; and `_launch_shard()`, this process's (rank, world size) from the launcher's
 * environment as the library reads it (ts_dist_env_detect).
 *
 * Options take the library's names: the strings go through its parsers (ts_shuffle_parse, ts_last_batch_parse,
 * ts_color_parse, ts_decode_device_parse, ts_device_get), the numbers into ts_pipeline_opts as they are (mean and
 * std in pixel units, the library's convention; data.py converts torchvision's).
 *
 * Batches: next() returns the batch as tessera.Tensors holding a reference to the pipeline's memory (no copy);
 * the library gives a slot new memory when a batch handed out is still referenced, so a batch kept (or shared
 * with torch through DLPack) is never overwritten.
 *
 * Waiting: next() waits for its batch with the GIL released, 0.1 s at a time (ts_pipeline_wait); between waits
 * it runs PyErr_CheckSignals, so Ctrl-C interrupts a long decode (the pipeline stays usable: the batch is
 * still being prepared). One call at a time per pipeline: a call from a second thread while one runs, or any
 * call after close(), raises tessera.Error naming the reason, never a crash.
 */
#include "tspy.h"

#include <string.h>

#define WAIT_SLICE_S 0.1 /* how often a waiting next() looks for Ctrl-C */

static PyObject *Error, *ArgumentError; /* the module's (_tessera.c adds them before this part) */

typedef struct {
    PyObject_HEAD
    ts_pipeline *p;
    int busy; /* a call is running with the GIL released */
} Pipeline;

/* ---- option parsing ------------------------------------------------------------------------------------ */

/* A sequence of lo..hi numbers into out; returns the count, or -1 with ArgumentError naming the option. */
static int float_seq(PyObject *o, const char *name, int lo, int hi, float *out) {
    PyObject *seq = PySequence_Check(o) ? Py_NewRef(o) : NULL;
    Py_ssize_t n = seq ? PySequence_Size(seq) : -1;
    if (n < lo || n > hi) {
        Py_XDECREF(seq);
        PyErr_Clear();
        if (lo == hi) PyErr_Format(ArgumentError, "tessera.data: %s must be a sequence of %d numbers", name, lo);
        else PyErr_Format(ArgumentError, "tessera.data: %s must be a sequence of %d to %d numbers", name, lo, hi);
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *it = PySequence_GetItem(seq, i);
        double v = it ? PyFloat_AsDouble(it) : -1.0;
        Py_XDECREF(it);
        if (PyErr_Occurred()) {
            Py_DECREF(seq);
            PyErr_Clear();
            PyErr_Format(ArgumentError, "tessera.data: %s[%zd] is not a number", name, i);
            return -1;
        }
        out[i] = (float)v;
    }
    Py_DECREF(seq);
    return (int)n;
}

/* mean/std: one value (every channel) or one per channel. */
static int channel_values(PyObject *o, const char *name, int channels, float *out) {
    int n = float_seq(o, name, 1, 3, out);
    if (n < 0) return -1;
    if (n != 1 && n != channels) {
        PyErr_Format(ArgumentError, "tessera.data: %s has %d values for %d channels (give 1 or %d)", name, n, channels,
                     channels);
        return -1;
    }
    for (int c = n; c < 3; c++) out[c] = out[0];
    return 0;
}

/* The string options, through the library's parsers. */
static int parse_names(ts_pipeline_opts *o, const char *shuffle, const char *last_batch, const char *color,
                       const char *decode, const char *device) {
    ts_shuffle sh;
    ts_status st = ts_shuffle_parse(shuffle, &sh);
    if (st == TS_OK) st = ts_last_batch_parse(last_batch, &o->last_batch);
    if (st == TS_OK) st = ts_color_parse(color, &o->color);
    if (st == TS_OK) st = ts_decode_device_parse(decode, &o->decode);
    if (st == TS_OK) st = ts_device_get(device, &o->device);
    if (st != TS_OK) {
        tspy_raise(st);
        return -1;
    }
    ts_reader_opts_set_shuffle(&o->reader, sh);
    return 0;
}

/* Pipeline(*, root=None, file_list=None, batch_size, width, height, ...): see data.py for each option. */
static int pipeline_init(PyObject *self_, PyObject *args, PyObject *kw) {
    Pipeline *self = (Pipeline *)self_;
    static char *names[] = {"root", "file_list", "batch_size", "width", "height", "shard_id", "num_shards",
                            "random_resized_crop", "scale", "ratio", "flip", "center_crop", "mean", "std", "color",
                            "threads", "prefetch", "seed", "shuffle", "initial_fill", "shuffle_seed",
                            "stick_to_shard", "last_batch", "decode", "device", "skip_corrupt", "jpeg_scaled_decode",
                            "max_pixels", NULL};
    ts_pipeline_opts o = TS_PIPELINE_OPTS_INIT;
    PyObject *root = NULL, *file_list = NULL, *scale = NULL, *ratio = NULL, *mean = NULL, *std = NULL;
    const char *shuffle = "none", *last_batch = "partial", *color = "rgb", *decode = "cpu", *device = "cpu";
    long long batch = o.batch_size, seed = 0, shuffle_seed = o.reader.shuffle_after_epoch_seed, max_pixels = 0;
    int rrc = 0, stick = 0, skip = 0, scaled = 1;
    if (self->p) {
        PyErr_SetString(Error, "tessera.data: a Pipeline is initialised once");
        return -1;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|$O&O&LiiiipOOffOOsiiLsiLpsssppL", names, tspy_path_or_none, &root,
                                     tspy_path_or_none, &file_list, &batch, &o.out_width, &o.out_height, &o.reader.shard_id,
                                     &o.reader.num_shards, &rrc, &scale, &ratio, &o.flip_prob, &o.center_crop, &mean,
                                     &std, &color, &o.num_threads, &o.prefetch_queue_depth, &seed, &shuffle,
                                     &o.reader.initial_fill, &shuffle_seed, &stick, &last_batch, &decode, &device,
                                     &skip, &scaled, &max_pixels))
        return -1;
    int rc = -1;
    if (!root && !file_list) {
        PyErr_SetString(ArgumentError, "tessera.data: give root (a folder of class folders) or file_list");
        goto done;
    }
    o.reader.file_root = root ? PyBytes_AsString(root) : NULL;
    o.reader.file_list = file_list ? PyBytes_AsString(file_list) : NULL;
    o.batch_size = (int64_t)batch;
    o.reader.seed = (int64_t)seed;
    o.reader.shuffle_after_epoch_seed = (int64_t)shuffle_seed;
    o.reader.stick_to_shard = stick;
    o.random_resized_crop = rrc;
    o.skip_corrupt = skip;
    o.jpeg_scaled_decode = scaled;
    o.max_pixels = (int64_t)max_pixels;
    if (parse_names(&o, shuffle, last_batch, color, decode, device) < 0) goto done;
    if ((scale && scale != Py_None && float_seq(scale, "scale", 2, 2, o.rrc_scale) < 0) ||
        (ratio && ratio != Py_None && float_seq(ratio, "ratio", 2, 2, o.rrc_ratio) < 0) ||
        (mean && mean != Py_None && channel_values(mean, "mean", (int)o.color, o.mean) < 0) ||
        (std && std != Py_None && channel_values(std, "std", (int)o.color, o.std) < 0))
        goto done;
    ts_pipeline *p = NULL;
    ts_status st;
    Py_BEGIN_ALLOW_THREADS st = ts_pipeline_new(&o, &p); /* lists the folder, starts the workers */
    Py_END_ALLOW_THREADS
    if (st != TS_OK) {
        tspy_raise(st);
        goto done;
    }
    self->p = p;
    rc = 0;
done:
    Py_XDECREF(root);
    Py_XDECREF(file_list);
    return rc;
}

/* ---- calls --------------------------------------------------------------------------------------------- */

/* The pipeline for a call: NULL with tessera.Error when it is closed or in use by another thread. */
static ts_pipeline *enter(Pipeline *self, const char *call) {
    if (!self->p) {
        PyErr_Format(Error, "tessera.data.Pipeline.%s: the pipeline is closed", call);
        return NULL;
    }
    if (self->busy) {
        PyErr_Format(Error, "tessera.data.Pipeline.%s: another thread is in a call on this pipeline (one call at a "
                     "time)", call);
        return NULL;
    }
    return self->p;
}

static PyObject *info_dict(const ts_batch_info *bi) {
    return Py_BuildValue("{s:L,s:L,s:L,s:L,s:L,s:O,s:O}", "epoch", (long long)bi->epoch, "batch",
                         (long long)bi->batch, "size", (long long)bi->size, "real", (long long)bi->real, "skipped",
                         (long long)bi->skipped, "last", bi->last ? Py_True : Py_False, "epoch_end",
                         bi->epoch_end ? Py_True : Py_False);
}

/* next() -> (x, y, info): the batch as tessera.Tensors, or (None, None, info) at an epoch's end. */
static PyObject *pipeline_next(PyObject *self_, PyObject *unused) {
    (void)unused;
    Pipeline *self = (Pipeline *)self_;
    ts_pipeline *p = enter(self, "next");
    if (!p) return NULL;
    self->busy = 1;
    ts_status st = TS_OK;
    for (;;) { /* wait for the batch a slice at a time, looking for Ctrl-C in between */
        bool ready = false;
        Py_BEGIN_ALLOW_THREADS st = ts_pipeline_wait(p, WAIT_SLICE_S, &ready);
        Py_END_ALLOW_THREADS
        if (st != TS_OK || ready) break;
        if (PyErr_CheckSignals() < 0) {
            self->busy = 0;
            return NULL;
        }
    }
    ts_tensor *x = NULL, *y = NULL;
    ts_batch_info bi;
    if (st == TS_OK) {
        Py_BEGIN_ALLOW_THREADS st = ts_pipeline_next(p, &x, &y, &bi);
        Py_END_ALLOW_THREADS
    }
    self->busy = 0;
    if (st != TS_OK) return tspy_raise(st);
    PyObject *info = info_dict(&bi);
    if (!info) return NULL;
    if (!x) return Py_BuildValue("(OON)", Py_None, Py_None, info);
    PyObject *px = tspy_tensor_wrap(ts_tensor_retain(x)), *py = px ? tspy_tensor_wrap(ts_tensor_retain(y)) : NULL;
    if (!py) {
        Py_XDECREF(px);
        Py_DECREF(info);
        return NULL;
    }
    return Py_BuildValue("(NNN)", px, py, info);
}

/* seek(epoch, batch): the next batch is `batch` of `epoch`, as an uninterrupted run has it there. */
static PyObject *pipeline_seek(PyObject *self_, PyObject *args) {
    Pipeline *self = (Pipeline *)self_;
    long long epoch, batch;
    if (!PyArg_ParseTuple(args, "LL", &epoch, &batch)) return NULL;
    ts_pipeline *p = enter(self, "seek");
    if (!p) return NULL;
    self->busy = 1;
    ts_status st;
    Py_BEGIN_ALLOW_THREADS st = ts_pipeline_seek(p, (int64_t)epoch, (int64_t)batch); /* waits for decodes */
    Py_END_ALLOW_THREADS
    self->busy = 0;
    if (st != TS_OK) return tspy_raise(st);
    Py_RETURN_NONE;
}

/* num_batches(epoch=None): batches in `epoch` (the current one when None). */
static PyObject *pipeline_num_batches(PyObject *self_, PyObject *args) {
    Pipeline *self = (Pipeline *)self_;
    PyObject *eo = Py_None;
    if (!PyArg_ParseTuple(args, "|O", &eo)) return NULL;
    ts_pipeline *p = enter(self, "num_batches");
    if (!p) return NULL;
    long long e = eo == Py_None ? (long long)ts_pipeline_epoch(p) : PyLong_AsLongLong(eo);
    if (e == -1 && PyErr_Occurred()) return NULL;
    if (e < 0) return PyErr_Format(ArgumentError, "tessera.data.Pipeline.num_batches: epoch %lld is negative", e);
    return PyLong_FromLongLong((long long)ts_pipeline_num_batches(p, (int64_t)e));
}

static PyObject *pipeline_counts(PyObject *self_, PyObject *unused) {
    (void)unused;
    ts_pipeline *p = enter((Pipeline *)self_, "counts");
    if (!p) return NULL;
    int64_t dec = 0, skipped = 0;
    ts_pipeline_counts(p, &dec, &skipped);
    return Py_BuildValue("(LL)", (long long)dec, (long long)skipped);
}

/* indices() -> [int]: the listing-order index of each row of the batch next() returned last. */
static PyObject *pipeline_indices(PyObject *self_, PyObject *unused) {
    (void)unused;
    ts_pipeline *p = enter((Pipeline *)self_, "indices");
    if (!p) return NULL;
    int64_t n = 0;
    const int64_t *idx = ts_pipeline_batch_samples(p, &n);
    PyObject *l = PyList_New((Py_ssize_t)n);
    for (int64_t i = 0; l && i < n; i++) {
        PyObject *v = PyLong_FromLongLong((long long)idx[i]);
        if (!v) {
            Py_CLEAR(l);
            break;
        }
        PyList_SetItem(l, (Py_ssize_t)i, v);
    }
    return l;
}

/* path(i), label(i), class_name(k): the reader's listing. */
static PyObject *pipeline_path(PyObject *self_, PyObject *arg) {
    ts_pipeline *p = enter((Pipeline *)self_, "path");
    if (!p) return NULL;
    const ts_reader *r = ts_pipeline_reader(p);
    long long i = PyLong_AsLongLong(arg);
    if (i == -1 && PyErr_Occurred()) return NULL;
    if (i < 0 || i >= (long long)ts_reader_size(r))
        return PyErr_Format(ArgumentError, "tessera.data.Pipeline.path: sample %lld is not in [0, %lld)", i,
                            (long long)ts_reader_size(r));
    const char *s = ts_reader_path(r, (int64_t)i);
    if (!s) Py_RETURN_NONE;
    return PyUnicode_DecodeFSDefault(s);
}

static PyObject *pipeline_class_names(PyObject *self_, void *closure) {
    (void)closure;
    ts_pipeline *p = enter((Pipeline *)self_, "class_names");
    if (!p) return NULL;
    const ts_reader *r = ts_pipeline_reader(p);
    int64_t n = ts_reader_num_classes(r);
    PyObject *l = PyList_New((Py_ssize_t)n);
    for (int64_t k = 0; l && k < n; k++) {
        const char *s = ts_reader_class_name(r, k);
        PyObject *v = s ? PyUnicode_DecodeFSDefault(s) : Py_NewRef(Py_None);
        if (!v) {
            Py_CLEAR(l);
            break;
        }
        PyList_SetItem(l, (Py_ssize_t)k, v);
    }
    return l;
}

/* close(): stops the workers and frees the pipeline (batches handed out stay valid). Idempotent. */
static PyObject *pipeline_close(PyObject *self_, PyObject *unused) {
    (void)unused;
    Pipeline *self = (Pipeline *)self_;
    if (self->busy) return PyErr_Format(Error, "tessera.data.Pipeline.close: another thread is in a call on it");
    ts_pipeline *p = self->p;
    self->p = NULL;
    Py_BEGIN_ALLOW_THREADS ts_pipeline_free(p); /* joins the workers */
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static void pipeline_dealloc(PyObject *o) {
    Pipeline *self = (Pipeline *)o;
    PyTypeObject *tp = Py_TYPE(o);
    ts_pipeline *p = self->p;
    self->p = NULL;
    if (p) {
        Py_BEGIN_ALLOW_THREADS ts_pipeline_free(p);
        Py_END_ALLOW_THREADS
    }
    freefunc f = (freefunc)PyType_GetSlot(tp, Py_tp_free);
    f(o);
    Py_DECREF(tp);
}

/* ---- properties ---------------------------------------------------------------------------------------- */
static PyObject *get_epoch(PyObject *o, void *c) {
    (void)c;
    ts_pipeline *p = enter((Pipeline *)o, "epoch");
    return p ? PyLong_FromLongLong((long long)ts_pipeline_epoch(p)) : NULL;
}
static PyObject *get_batch_index(PyObject *o, void *c) {
    (void)c;
    ts_pipeline *p = enter((Pipeline *)o, "batch_index");
    return p ? PyLong_FromLongLong((long long)ts_pipeline_batch_index(p)) : NULL;
}
static PyObject *get_size(PyObject *o, void *c) {
    (void)c;
    ts_pipeline *p = enter((Pipeline *)o, "size");
    return p ? PyLong_FromLongLong((long long)ts_reader_size(ts_pipeline_reader(p))) : NULL;
}
static PyObject *get_shard_size(PyObject *o, void *c) {
    (void)c;
    ts_pipeline *p = enter((Pipeline *)o, "shard_size");
    return p ? PyLong_FromLongLong((long long)ts_reader_shard_size(ts_pipeline_reader(p), ts_pipeline_epoch(p)))
             : NULL;
}
static PyObject *get_num_classes(PyObject *o, void *c) {
    (void)c;
    ts_pipeline *p = enter((Pipeline *)o, "num_classes");
    return p ? PyLong_FromLongLong((long long)ts_reader_num_classes(ts_pipeline_reader(p))) : NULL;
}
static PyObject *get_sample_shape(PyObject *o, void *c) {
    (void)c;
    ts_pipeline *p = enter((Pipeline *)o, "sample_shape");
    if (!p) return NULL;
    int64_t s[3];
    ts_pipeline_sample_shape(p, s);
    return Py_BuildValue("(LLL)", (long long)s[0], (long long)s[1], (long long)s[2]);
}
static PyObject *get_closed(PyObject *o, void *c) {
    (void)c;
    return PyBool_FromLong(((Pipeline *)o)->p == NULL);
}

static PyGetSetDef pipeline_getset[] = {
    {"epoch", get_epoch, NULL, "The epoch of the next batch.", NULL},
    {"batch_index", get_batch_index, NULL, "The index of the next batch in its epoch.", NULL},
    {"size", get_size, NULL, "Samples in the whole data set (every shard).", NULL},
    {"shard_size", get_shard_size, NULL, "Real samples this shard reads in the current epoch.", NULL},
    {"num_classes", get_num_classes, NULL, "Classes (labels are below it).", NULL},
    {"class_names", pipeline_class_names, NULL, "The class names (folder names), label order.", NULL},
    {"sample_shape", get_sample_shape, NULL, "(C, H, W) of one output image.", NULL},
    {"closed", get_closed, NULL, "Whether close() was called.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMethodDef pipeline_methods[] = {
    {"next", pipeline_next, METH_NOARGS,
     "next() -> (x, y, info): the next batch (tessera.Tensors, no copy), or (None, None, info) at an epoch's end "
     "(the call after starts the next epoch). Waits with the GIL released; Ctrl-C interrupts it."},
    {"seek", pipeline_seek, METH_VARARGS, "seek(epoch, batch): continue at batch `batch` of `epoch` (resume)."},
    {"num_batches", pipeline_num_batches, METH_VARARGS, "num_batches(epoch=None) -> batches of that epoch."},
    {"counts", pipeline_counts, METH_NOARGS, "counts() -> (decoded, skipped) samples so far, prefetched included."},
    {"indices", pipeline_indices, METH_NOARGS, "indices() -> listing-order index of each row of the last batch."},
    {"path", pipeline_path, METH_O, "path(i) -> the file of sample i (listing order)."},
    {"close", pipeline_close, METH_NOARGS, "close(): stop the workers and free the pipeline."},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot pipeline_slots[] = {
    {Py_tp_init, pipeline_init},
    {Py_tp_new, PyType_GenericNew},
    {Py_tp_dealloc, pipeline_dealloc},
    {Py_tp_getset, pipeline_getset},
    {Py_tp_methods, pipeline_methods},
    {Py_tp_doc, "The C library's input pipeline (tessera.data.ImagePipeline is the interface to use)."},
    {0, NULL},
};

static PyType_Spec pipeline_spec = {"tessera._tessera.Pipeline", sizeof(Pipeline), 0, Py_TPFLAGS_DEFAULT,
                                    pipeline_slots};

/* _launch_shard() -> (rank, world_size, source): the launcher's environment as the library reads it. */
static PyObject *launch_shard(PyObject *mod, PyObject *unused) {
    (void)mod;
    (void)unused;
    ts_dist_env e;
    ts_status st = ts_dist_env_detect(&e, NULL);
    if (st != TS_OK) return tspy_raise(st);
    return Py_BuildValue("(iis)", e.rank, e.world_size, e.source);
}

static PyMethodDef pipeline_functions[] = {
    {"_launch_shard", launch_shard, METH_NOARGS,
     "_launch_shard() -> (rank, world_size, source) from the launcher's environment (torchrun, tessera run, "
     "mpirun, srun, RANK/WORLD_SIZE); (0, 1, 'none') without one."},
    {NULL, NULL, 0, NULL},
};

int tspy_add_pipeline(PyObject *m) {
    Error = PyObject_GetAttrString(m, "Error");
    ArgumentError = PyObject_GetAttrString(m, "ArgumentError");
    if (!Error || !ArgumentError) return -1;
    PyObject *tp = PyType_FromSpec(&pipeline_spec);
    if (!tp || PyModule_AddObject(m, "Pipeline", tp) < 0) {
        Py_XDECREF(tp);
        return -1;
    }
    return PyModule_AddFunctions(m, pipeline_functions);
}
